// Package inbox is the consuming half of the outbox/inbox pattern: it reads
// events from Kafka and runs a handler for each one inside a database
// transaction that also records the event's id in the inbox table. A
// redelivered event finds its inbox row and is acknowledged as a counted
// no-op, so the handler's side effects happen at most once per consumer even
// though Kafka delivers at least once.
//
// Guarantees:
//   - The handler's writes and the inbox row commit together or not at all.
//   - The Kafka offset is committed only after that database commit; a crash
//     in between redelivers the event, which the inbox absorbs.
//   - Events of one partition (so of one aggregate, keyed by aggregate id)
//     are handled in order, one at a time.
//   - A message that cannot be handled — undecodable, invalid, or failing
//     after MaxAttempts tries — goes to the dead-letter topic with the reason
//     and its original coordinates as headers, and the partition moves on.
//     Nothing is dropped silently.
package inbox
