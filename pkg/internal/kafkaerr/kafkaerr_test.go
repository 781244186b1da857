package kafkaerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/kafkaerr"
)

func TestIsMessageError(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"too large before sending", kafka.MessageTooLargeError{}, true},
		{"too large, wrapped", fmt.Errorf("publishing: %w", kafka.MessageTooLargeError{}), true},
		{"broker: message size too large", kafka.MessageSizeTooLarge, true},
		{"record list too large", kafka.RecordListTooLarge, true},
		{"corrupt message", kafka.InvalidMessage, true},
		{"invalid message size", kafka.InvalidMessageSize, true},
		{"invalid record", fmt.Errorf("%w: bad key", kafka.InvalidRecord), true},
		{"policy violation", kafka.PolicyViolation, true},
		{"unsupported for message format", kafka.UnsupportedForMessageFormat, true},
		{"write errors, all message errors", kafka.WriteErrors{nil, kafka.MessageSizeTooLarge}, true},
		{"write errors, one about the broker", kafka.WriteErrors{kafka.MessageSizeTooLarge, kafka.NotLeaderForPartition}, false},
		{"write errors, none", kafka.WriteErrors{nil, nil}, false},
		{"not leader", kafka.NotLeaderForPartition, false},
		{"leader not available", kafka.LeaderNotAvailable, false},
		{"request timed out", kafka.RequestTimedOut, false},
		{"not enough replicas", kafka.NotEnoughReplicas, false},
		{"unknown topic (being created)", kafka.UnknownTopicOrPartition, false},
		{"dial refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false},
		{"connection reset", fmt.Errorf("writing: %w", syscall.ECONNRESET), false},
		{"eof", io.EOF, false},
		{"deadline", context.DeadlineExceeded, false},
		{"other", errors.New("something"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := kafkaerr.IsMessageError(tt.err); got != tt.want {
				t.Errorf("IsMessageError(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
