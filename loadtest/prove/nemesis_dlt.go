package prove

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// The dlt fault (issue 29, opt-in: it runs only when NEMESIS= names it, so
// the default schedule of every seed stays what it was): the shim's
// dead-letter topic refuses every record for a while (its
// max.message.bytes lowered below any dead letter, even a truncated one),
// while the third party rejects the next calls (422: the shim dead-letters
// them). Those dead letters are in no topic: the shim's inbox keeps each
// one's row and its original whole, and the end-of-run requeue-all must
// send them from there, each booked once, nothing lost.
//
// It is one of the opt-in kinds (NemesisOptInKinds, nemesis_outbox.go). The fault puts the topic's setting back itself, retried for up
// to limitRestoreFor.
const NemDLT = "dlt"

// planDLT fills in a dlt step: N calls rejected, for Hold. Its target is
// the busy key of the thirdparty kind ("thirdparty/"), since it sets the
// third party's faults too: the two never overlap.
func planDLT(s *step, dur func(lo, hi time.Duration) time.Duration, pick func([]string) string) {
	s.Target = "thirdparty/"
	s.N, _ = strconv.Atoi(pick([]string{"1", "2", "3", "4", "5"}))
	s.Hold = dur(3*time.Second, 10*time.Second)
}

// dltRefusingBytes is below the size of any dead letter: the dead-letter
// headers alone are larger.
const dltRefusingBytes = 100

// runDLT runs the fault for s.Hold, then puts the topic's setting back
// (retried as the limit fault retries it, since another step may have
// Kafka down).
func (n *nemesisRun) runDLT(ctx context.Context, s step) (string, error) {
	topic := n.p.BillingTop + ".dlt"
	lowerErr := alterTopicMaxMessageBytes(ctx, n.h.stack.Brokers(), topic, kafka.ConfigOperationSet, fmt.Sprint(dltRefusingBytes))
	body := fmt.Sprintf(`{"rejectNext":%d}`, s.N)
	var tpErr error
	if lowerErr == nil {
		tpErr = postJSON(ctx, n.p.Recon.AdminURL()+"/admin/faults", []byte(body), nil)
		hold(ctx, s.Hold)
		if err := postJSON(context.WithoutCancel(ctx), n.p.Recon.AdminURL()+"/admin/faults", []byte(`{}`), nil); tpErr == nil {
			tpErr = err
		}
	}
	took, err := n.restoreDLT(context.WithoutCancel(ctx))
	detail := fmt.Sprintf("%s max.message.bytes=%d and the third party %s for %.1fs, restored in %.1fs",
		topic, dltRefusingBytes, body, s.Hold.Seconds(), took.Seconds())
	if lowerErr != nil {
		detail = fmt.Sprintf("lowering %s max.message.bytes failed (%v); the default confirmed in %.1fs", topic, lowerErr, took.Seconds())
	}
	return detail, errors.Join(tpErr, err)
}

// restoreDLT deletes the shim's dead-letter topic's max.message.bytes
// override, retrying for up to limitRestoreFor.
func (n *nemesisRun) restoreDLT(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(limitRestoreFor)
	topic := n.p.BillingTop + ".dlt"
	for try := 1; ; try++ {
		err := alterTopicMaxMessageBytes(ctx, n.h.stack.Brokers(), topic, kafka.ConfigOperationDelete, "")
		if err == nil {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("restoring %s max.message.bytes: %d tries in %s: %w", topic, try, limitRestoreFor, err)
		}
		hold(ctx, time.Second)
	}
}

// alterTopicMaxMessageBytes sets (op Set) or deletes (op Delete) topic's
// max.message.bytes, and nothing else of its configuration.
func alterTopicMaxMessageBytes(ctx context.Context, brokers []string, topic string, op kafka.ConfigOperation, value string) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := client.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{
		Resources: []kafka.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: topic,
			Configs: []kafka.IncrementalAlterConfigsRequestConfig{{Name: "max.message.bytes", Value: value, ConfigOperation: op}},
		}},
	})
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return r.Error
		}
	}
	return nil
}
