// Package onceflow is the project's k6 extension, imported by scripts as
// "k6/x/onceflow". It gives a load test what the HTTP API alone cannot:
//
//   - the commit-to-settlement lag of every order the script placed, read
//     from the databases: the order's commit time (orders) against the time
//     the shim recorded forwarding its payment to the third party (shim);
//   - the audit at the end: each placed order settled exactly once, or it
//     was lost, or it was settled twice;
//   - the outbox backlogs and the ledger counts (orders, charges, forwards);
//   - raw Kafka produce, so scripts can redeliver published events
//     (duplicates) and send messages no consumer can decode (poison).
//
// One tracker is shared by every VU of the k6 process: the load VUs call
// track() after each order they place, and one probe VU calls poll() to turn
// settled orders into lag samples. See loadtest/k6/lib.js for how the
// scenarios use it.
package onceflow

import (
	"go.k6.io/k6/js/modules"
)

// k6 discovers extensions only through registration at import time, so this
// is the one init with a side effect in the project.
func init() {
	modules.Register("k6/x/onceflow", New())
}

// RootModule is created once per k6 process; what it holds is shared by all
// VUs of the run.
type RootModule struct {
	clients *clients
}

// New returns the root module.
func New() *RootModule {
	return &RootModule{clients: newClients()}
}

// NewModuleInstance gives each VU its view of the module.
func (r *RootModule) NewModuleInstance(vu modules.VU) modules.Instance {
	return &ModuleInstance{vu: vu, root: r}
}

// ModuleInstance is one VU's instance of the module.
type ModuleInstance struct {
	vu   modules.VU
	root *RootModule
}

// Exports makes connect the module's default export's one function.
func (mi *ModuleInstance) Exports() modules.Exports {
	return modules.Exports{Default: &API{mi: mi}}
}

// API is what `import onceflow from "k6/x/onceflow"` gives a script.
type API struct {
	mi *ModuleInstance
}

// Connect returns the run's client for cfg, opening its pools and Kafka
// writer the first time any VU asks; later calls with the same settings
// share them (and the order tracker).
func (a *API) Connect(cfg Config) (*Client, error) {
	c, err := a.mi.root.clients.get(a.mi.vu.Context(), cfg)
	if err != nil {
		return nil, err
	}
	return &Client{shared: c, vu: a.mi.vu}, nil
}
