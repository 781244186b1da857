package main

import (
	"testing"

	"github.com/onceflow/onceflow/platform/composecheck"
)

// The compose file must set every variable this program reads (the defaults
// point at the dev stack on 127.0.0.1, not at the other containers), and the
// harness's spec of it must name only variables it reads.
func TestDockerComposeSetsEveryVariable(t *testing.T) {
	t.Parallel()
	composecheck.CheckProgram(t, "../../../../docker-compose.yml", "orders", &Config{})
}
