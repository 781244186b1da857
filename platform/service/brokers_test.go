package service

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// A service whose KAFKA_BROKERS names every broker starts quietly; one that
// names only the first warns at start when the cluster has more, naming the
// brokers it left out. On the dev stack's single broker both lists are the
// same and neither warns; on a cluster (ONCEFLOW_TEST_KAFKA_BROKERS naming
// its three brokers) the short list must warn.
func TestStartWarnsWhenKafkaBrokersNamesFewerThanTheCluster(t *testing.T) {
	t.Parallel()
	brokers := testinfra.KafkaBrokers(t)
	ctx := context.Background()
	cluster, err := kafkautil.DescribeCluster(ctx, kafkautil.Security{}, brokers)
	if err != nil {
		t.Fatal(err)
	}
	if cluster.Size != len(brokers) {
		t.Fatalf("ONCEFLOW_TEST_KAFKA_BROKERS names %d brokers of a cluster of %d: name them all", len(brokers), cluster.Size)
	}
	for _, tc := range []struct {
		listed   []string
		wantWarn bool
	}{
		{brokers, false},
		{brokers[:1], cluster.Size > 1},
	} {
		var logs bytes.Buffer
		warned, err := checkBrokerList(ctx, slog.New(slog.NewTextHandler(&logs, nil)), kafkautil.Security{}, tc.listed)
		if err != nil {
			t.Fatalf("KAFKA_BROKERS=%v: %v", tc.listed, err)
		}
		if warned != tc.wantWarn || strings.Contains(logs.String(), "KAFKA_BROKERS names fewer") != tc.wantWarn {
			t.Errorf("KAFKA_BROKERS=%v on a cluster of %d: warned %v, want %v; logged:\n%s", tc.listed, cluster.Size, warned, tc.wantWarn, logs.String())
		}
		if tc.wantWarn {
			for _, b := range brokers[1:] {
				if !strings.Contains(logs.String(), b) {
					t.Errorf("the warning does not name the unlisted broker %s:\n%s", b, logs.String())
				}
			}
			t.Logf("warned: %s", logs.String())
		}
	}
}
