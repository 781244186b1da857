// Package kafkasafe builds the Kafka clients the outbox and the inbox need,
// with the settings their promises rest on, instead of kafka-go's unsafe
// zero values: NewWriter (acks from every in-sync replica, a batch timeout
// of a fraction of a millisecond, keys hashed as Kafka's Java producer
// hashes them) and EnsureTopics (partitions, replication factor,
// min.insync.replicas, the dead-letter topic beside each topic).
//
// outbox.NewRelay and inbox.NewConsumer refuse a *kafka.Writer that lacks
// one of these settings, naming it (CheckWriter is the same check), and a
// consumer's Run refuses to start while its dead-letter topic does not
// exist. An adopter who builds the writer here never sees either refusal.
//
// The package imports kafka-go and nothing of the platform, so a team that
// copies pkg/ gets it with the libraries.
package kafkasafe
