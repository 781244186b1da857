// Package dashboards holds onceflow's Grafana dashboards, generated from the
// Go code in this package, and its Prometheus alert rules (alerts/).
//
// The dashboards are code so that every panel has a unit and a description
// of what healthy looks like, every query filters on the service variable,
// and a test can hold the committed JSON to the code that made it. After a
// change here, regenerate the JSON:
//
//	go generate ./dashboards/
//
// The tests check that the JSON is current, run promtool over the rules and
// their unit tests, and evaluate every dashboard query and every alert
// expression against a real Prometheus scraping the real services.
package dashboards

//go:generate go run ./cmd/dashgen -out grafana/dashboards
