// Command pgroles creates the platform's least-privilege database roles on
// the dev stack's PostgreSQL (see package pgroles): per service database
// orders, billing and shim an owner role (<service>_owner, migrates) and a
// runtime role (<service>_app, reads and writes the tables), plus
// reconcile_ro, which may only read all three. It is idempotent;
// devstack/stack.sh runs it after creating the databases.
//
//	pgroles            ensure the roles (ONCEFLOW_PG_ADMIN_URL, a superuser)
//	pgroles -script    print them as a psql script for fresh databases, the
//	                   passwords left to psql variables (devstack/compose/
//	                   initdb-roles.sql, via go generate; initdb-roles.sh runs it)
//
// Passwords default to the role's name, for the dev stack only; set
// PG_<ROLE>_PASSWORD (e.g. PG_ORDERS_APP_PASSWORD, PG_RECONCILE_RO_PASSWORD)
// to override.
package main

import "github.com/onceflow/onceflow/platform/lifecycle"

//go:generate sh -c "go run . -script > ../../../devstack/compose/initdb-roles.sql"

func main() { lifecycle.Main("pgroles", run) }
