package kafkasafe

import (
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/writercheck"
)

// DefaultBatchSize is WriterConfig.BatchSize's default. The relay cuts its
// writes to fit one record batch per partition, so the size only bounds how
// much of a backlog one write takes, and which writes Writer.WriteMessages
// sends itself (a partition's messages up to this many); kafka-go's writer,
// which takes the others, allocates room for that many messages per
// partition of every write, so a larger one costs memory (issue 23).
const DefaultBatchSize = 100

// DefaultBatchTimeout is WriterConfig.BatchTimeout's default, for the writes
// Writer.WriteMessages leaves to kafka-go's writer. Callers write whole
// batches and wait for them, so any wait for more messages is latency on
// every write: kafka-go holds each partial batch for BatchTimeout even when
// the caller has handed it everything (at 200 µs one synchronous write of
// one message took 1.2 ms at the median against 0.12 ms at 1 µs in the same
// run, BenchmarkWriteLatency). A write's batch loses nothing to the
// short timeout: kafka-go adds one call's messages to a partition's batch
// under that partition's lock, and a timer that fires meanwhile waits for
// the lock before it sends the batch, so the batch holds every message of
// the call (up to BatchSize), as with a long timeout.
const DefaultBatchTimeout = time.Microsecond

// WriterConfig is what NewWriter's writer may change; the zero value is the
// libraries' writer.
type WriterConfig struct {
	// BatchSize caps the messages of one partition in one record batch.
	// Default DefaultBatchSize.
	BatchSize int
	// BatchTimeout is how long a partial batch waits for more. Default
	// DefaultBatchTimeout; CheckWriter refuses 100 ms or more.
	BatchTimeout time.Duration
	// Transport connects the writer (TLS, SASL). Default: a transport of
	// its own (a 3 s dial timeout, metadata refreshed every 2 s), never
	// kafka.DefaultTransport, which every writer of the process shares and
	// whose cached metadata hides a topic created after it looked.
	Transport *kafka.Transport
}

// Writer is a *kafka.Writer whose Close also closes its transport's
// connections and metadata refresh.
type Writer struct {
	*kafka.Writer
	transport *kafka.Transport
	closed    atomic.Bool // WriteMessages's own path refuses writes after Close, as kafka-go's does
}

// KafkaWriter returns the writer w wraps: the relay reads its batch limits
// through it, and the libraries check its settings through it.
func (w *Writer) KafkaWriter() *kafka.Writer { return w.Writer }

// Close flushes and closes the writer, then its transport.
func (w *Writer) Close() error {
	w.closed.Store(true)
	err := w.Writer.Close()
	w.transport.CloseIdleConnections()
	return err
}

// NewWriter returns the writer the outbox relay and the inbox's dead-letter
// path expect:
//
//   - RequiredAcks = kafka.RequireAll: a write succeeds only once every
//     in-sync replica holds it (a Writer{} literal acks nothing, and the
//     relay would mark rows published that no broker kept);
//   - BatchTimeout a microsecond, not kafka-go's second: a write is sent as
//     soon as the call has added its messages (DefaultBatchTimeout);
//   - Balancer = murmur2 with the Java client's semantics
//     (toPositive(murmur2(key)) % partitions), the partitioner of Kafka's
//     Java producer and so of Kafka Connect, Debezium and Kafka Streams: the
//     same key lands on the same partition whoever publishes it. kafka-go's
//     own hash, FNV-1a, agrees with none of them. A nil key gets any
//     partition, as in Java;
//   - few retries with short backoff: the relay keeps a failed row pending
//     and retries it itself, so kafka-go's retries only add latency;
//   - no automatic topic creation: a topic is created on purpose, with its
//     replication (EnsureTopics).
func NewWriter(brokers []string, cfg WriterConfig) *Writer {
	if cfg.BatchSize < 1 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.BatchTimeout <= 0 {
		cfg.BatchTimeout = DefaultBatchTimeout
	}
	transport := cfg.Transport
	if transport == nil {
		transport = &kafka.Transport{DialTimeout: 3 * time.Second, MetadataTTL: 2 * time.Second}
	}
	return &Writer{transport: transport, Writer: &kafka.Writer{
		Addr:                   kafka.TCP(brokers...),
		Balancer:               &kafka.Murmur2Balancer{},
		RequiredAcks:           kafka.RequireAll,
		BatchSize:              cfg.BatchSize,
		BatchTimeout:           cfg.BatchTimeout,
		MaxAttempts:            3,
		WriteBackoffMin:        10 * time.Millisecond,
		WriteBackoffMax:        200 * time.Millisecond,
		AllowAutoTopicCreation: false,
		Transport:              transport,
	}}
}

// CheckWriter reports what makes w unsafe for the outbox relay, naming each
// setting: acks other than kafka.RequireAll, a BatchTimeout of 100 ms or
// more (or unset: kafka-go waits 1 s), a Balancer other than murmur2. w is a
// *kafka.Writer or wraps one (KafkaWriter() *kafka.Writer, as Writer does);
// any other value is the caller's own and passes. outbox.NewRelay and
// inbox.NewConsumer run the same check (the dead-letter writer's keys need
// no particular hash).
func CheckWriter(w any) error {
	return writercheck.Check(w, true, "kafkasafe")
}
