// Package orders is the producing service of the platform: it accepts orders
// over HTTP and writes each change together with its event (OrderPlaced,
// OrderCancelled) to the outbox in one transaction. It never talks to Kafka
// on the request path; the outbox relay in cmd/orders publishes the events
// to the orders.events topic.
package orders
