package kafkautil_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// TestClientsUseTheGivenSecurity points TLS at the dev stack's PLAINTEXT
// Kafka: ControllerWith, WaitTopicsReadyWith and NewGroupReaderWith must
// then fail to connect, which shows the Security reaches each of them, while
// their PLAINTEXT forms still work.
func TestClientsUseTheGivenSecurity(t *testing.T) {
	t.Parallel()
	brokers := testinfra.KafkaBrokers(t)
	topic := testinfra.NewTopic(t, brokers, 1)
	tlsSec := kafkautil.Security{TLS: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // never verified: the handshake must fail first
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ctrl, err := kafkautil.Controller(ctx, brokers)
	if err != nil {
		t.Fatalf("Controller over PLAINTEXT: %v", err)
	}
	ctrl.Close()
	if ctrl, err := kafkautil.ControllerWith(ctx, tlsSec, brokers); err == nil {
		ctrl.Close()
		t.Fatal("ControllerWith over TLS to a PLAINTEXT broker succeeded: the Security was not used")
	}

	if err := kafkautil.WaitTopicsReady(ctx, brokers, topic); err != nil {
		t.Fatalf("WaitTopicsReady over PLAINTEXT: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	if err := kafkautil.WaitTopicsReadyWith(short, tlsSec, brokers, topic); err == nil {
		t.Fatal("WaitTopicsReadyWith over TLS to a PLAINTEXT broker succeeded: the Security was not used")
	}

	// A reader dials lazily (and waits out failures), so its dialer is checked.
	r := kafkautil.NewGroupReaderWith(tlsSec, brokers, topic, testinfra.Name("group"))
	defer r.Close()
	if got := r.Config().Dialer; got == nil || got.TLS == nil {
		t.Fatalf("NewGroupReaderWith's reader dials with %+v, want the TLS dialer", got)
	}
	if plain := kafkautil.NewGroupReader(brokers, topic, "g"); plain.Config().Dialer.TLS != nil {
		t.Fatal("NewGroupReader's reader dials with TLS, want PLAINTEXT")
	} else {
		plain.Close()
	}
}
