// Package kafkaerr tells an error about a Kafka message (too large, corrupt,
// refused by a policy: the same message gets the same answer) from one about
// the broker (an outage, waited out). Only the libraries need it: the
// platform's own Kafka clients never decide a message's fate.
package kafkaerr

import (
	"errors"

	"github.com/segmentio/kafka-go"
)

// messageErrors are the broker error codes that judge the message itself:
// the same message written again gets the same answer.
var messageErrors = []kafka.Error{
	kafka.InvalidMessage, // CorruptMessage in the Java client
	kafka.InvalidMessageSize,
	kafka.MessageSizeTooLarge,
	kafka.RecordListTooLarge,
	kafka.InvalidRecord,
	kafka.PolicyViolation,
	kafka.UnsupportedForMessageFormat,
	kafka.InvalidTimestamp,
	kafka.UnsupportedCompressionType,
}

// IsMessageError reports whether err is about the message itself, so
// writing it again can never succeed: too large (the broker's
// MessageSizeTooLarge or RecordListTooLarge, or kafka-go's
// MessageTooLargeError before anything is sent), corrupt or invalid
// (InvalidMessage, InvalidMessageSize, InvalidRecord, InvalidTimestamp),
// refused by a topic policy (PolicyViolation) or in a format the topic
// cannot store (UnsupportedForMessageFormat, UnsupportedCompressionType).
// kafka.WriteErrors counts as a message error only when every error in it
// is one. Everything else is about the broker and transient: dial errors,
// io.EOF and connection resets, NotLeaderForPartition, LeaderNotAvailable,
// RequestTimedOut, NotEnoughReplicas, UnknownTopicOrPartition while a topic
// is being created, an ended context.
func IsMessageError(err error) bool {
	if err == nil {
		return false
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		seen := false
		for _, e := range we {
			if e == nil {
				continue
			}
			if !IsMessageError(e) {
				return false
			}
			seen = true
		}
		return seen
	}
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return true
	}
	for _, code := range messageErrors {
		if errors.Is(err, code) {
			return true
		}
	}
	return false
}
