package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/inbox/internal/dlt"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// errNoDeadLetterTopic is why Run refuses to start: the topic its dead
// letters go to does not exist. Without it, the first message that cannot
// be handled would wait at the head of its partition, retried for ever,
// holding back every message behind it (auto.create.topics.enable is off
// in production, and should be).
var errNoDeadLetterTopic = errors.New("inbox: the dead-letter topic does not exist")

// requireDeadLetterTopic returns nil once the broker says the consumer's
// dead-letter topic exists, errNoDeadLetterTopic (naming it and what to do)
// when it says it does not, and nil when ctx ends first. A broker that does
// not answer is waited out with capped backoff, as every outage is: it is
// no reason to refuse, and consuming could not start anyway.
func (c *Consumer) requireDeadLetterTopic(ctx context.Context) error {
	topic := c.cfg.DeadLetterTopic
	if topic == "" {
		topic = c.group.Topic + ".dlt"
	}
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		_, err := dlt.TopicPartitions(ctx, c.group.Dialer, c.group.Brokers, topic)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, kafka.UnknownTopicOrPartition):
			return fmt.Errorf("%w: consumer %s dead-letters the messages of %s to %s: create it beside %s "+
				"(kafkasafe.EnsureTopics with DeadLetters), or name an existing one in Config.DeadLetterTopic",
				errNoDeadLetterTopic, c.cfg.Name, c.group.Topic, topic, c.group.Topic)
		case ctx.Err() != nil:
			return nil
		}
		if time.Since(lastLog) >= c.cfg.ErrorLogInterval {
			lastLog = time.Now()
			c.cfg.Logger.WarnContext(ctx, "inbox cannot read the dead-letter topic's metadata; waiting for Kafka before consuming",
				slog.String("consumer", c.cfg.Name), slog.String("topic", topic), slog.Any("error", err))
		}
		if !retry.Sleep(ctx, retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)) {
			return nil
		}
	}
}
