// Command dashgen writes onceflow's Grafana dashboards as JSON files, one per
// dashboard, named after its uid: `go generate ./dashboards/` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/onceflow/onceflow/dashboards"
)

func main() {
	out := flag.String("out", "grafana/dashboards", "directory to write the dashboards to")
	flag.CommandLine.SetOutput(os.Stdout) // -h is asked for: its answer goes where the asker reads
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "dashgen:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	files, err := dashboards.Files()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}
