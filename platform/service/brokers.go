package service

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/onceflow/onceflow/platform/kafkautil"
)

// watchBrokerList compares KAFKA_BROKERS with the cluster once Kafka
// answers (checkBrokerList), asking again with a capped backoff while it
// does not, and returns after the one comparison or when ctx ends. It runs
// beside the service from Run: a service that starts during a Kafka outage
// must not wait for Kafka to start, and is still told once Kafka is back.
func watchBrokerList(ctx context.Context, logger *slog.Logger, s kafkautil.Security, listed []string) {
	if len(listed) == 0 {
		return
	}
	wait := time.Second
	for {
		if _, err := checkBrokerList(ctx, logger, s, listed); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait): // Kafka did not answer; ask again later
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// checkBrokerList asks the cluster for its brokers and warns when listed
// names fewer of them than it has (kafkautil.Cluster.Unlisted): kafka-go
// learns where the cluster's partitions are only through the addresses it
// was given, so with one broker of three listed, that broker down stops
// every write and read although two brokers could serve them. It reports
// whether it warned; err is Kafka's when it did not answer.
func checkBrokerList(ctx context.Context, logger *slog.Logger, s kafkautil.Security, listed []string) (warned bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cluster, err := kafkautil.DescribeCluster(cctx, s, listed)
	if err != nil {
		return false, err
	}
	unlisted, short := cluster.Unlisted(listed)
	if !short {
		return false, nil
	}
	logger.WarnContext(ctx, "KAFKA_BROKERS names fewer brokers than the Kafka cluster has: "+
		"while the brokers it names are down this service cannot reach the cluster, though the others could serve it; list every broker",
		slog.String("kafka_brokers", strings.Join(listed, ",")), slog.Int("cluster_brokers", cluster.Size),
		slog.String("unlisted", strings.Join(unlisted, ",")))
	return true, nil
}
