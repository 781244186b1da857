// Command onceflowctl is the operator's tool for a running onceflow
// platform. It talks to each service's operator listener (ADMIN_ADDR:
// /metrics and /admin/*) with the bearer token in ADMIN_TOKEN, and reads
// the databases for the reconciliation report.
//
//	onceflowctl status                              backlog and lag of each service
//	onceflowctl dead-letters list [-service S]      dead outbox rows and inbox dead letters
//	onceflowctl dead-letters requeue -service S (-ids … | -event-ids … | -all)
//	onceflowctl parked [-service S] [-consumer C] [-aggregate A]   inbox events parked behind a dead one
//	onceflowctl parked release|skip -service S -consumer C -aggregate-type T -aggregate A -reason WHY
//	onceflowctl replay -service S -from T -to T [-aggregate-type … -aggregate-id …] [-apply]
//	onceflowctl reconcile                           the reconciliation report (make reconcile)
//
// Output is aligned tables for a person; -o json (before the command) gives
// the same data for scripts. Replay is a dry run unless -apply is given.
// The services' operator addresses come from ONCEFLOW_ORDERS_ADMIN,
// ONCEFLOW_BILLING_ADMIN and ONCEFLOW_SHIM_ADMIN (defaults
// http://127.0.0.1:9081, :9082, :9083), or the -orders, -billing and -shim
// flags. See docs/operations.md.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

func main() { lifecycle.Main("onceflowctl", run) }
