package contracts_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/platform/harness"
)

// TestProductionBinariesDoNotLinkTheCheckers: the schema validator, the
// CloudEvents SDK (and the sarama client its Kafka binding brings) and this
// module stay out of the programs a team ships; only the tests and
// contractcheck use them.
func TestProductionBinariesDoNotLinkTheCheckers(t *testing.T) {
	root := harness.Root(t)
	for _, s := range []harness.Spec{harness.Orders, harness.Billing, harness.Shim, harness.Reconciler} {
		cmd := exec.Command("go", "list", "-deps", s.Package)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", s.Package, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, banned := range []string{"github.com/cloudevents/", "github.com/santhosh-tekuri/", "github.com/IBM/sarama", "github.com/onceflow/onceflow/contracts"} {
				if strings.HasPrefix(dep, banned) {
					t.Errorf("%s links %s", s.Name, dep)
				}
			}
		}
	}
}
