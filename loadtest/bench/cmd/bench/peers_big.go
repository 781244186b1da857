package main

import (
	"context"
	"fmt"
	"os"
)

// The peers part's big transaction (-peers-big N; issue 23: one
// 1,000,000-event transaction, the drain against Debezium's with a cold
// JVM and the relay's peak RSS): after the rounds, each relay as a fresh
// process (Debezium: a fresh Kafka Connect, so a cold JVM) on a fresh
// database, slot and topic drains one N-event transaction, commit → the
// broker's append of its last record, and its process's peak RSS is read
// right after.

// PeerBig is one relay's drain of the big transaction.
type PeerBig struct {
	Relay   string  `json:"relay"`
	Events  int     `json:"events"`
	Seconds float64 `json:"drainSeconds"`
	// PeakRSS is the relay process's VmHWM after the drain, in bytes.
	PeakRSS int64 `json:"peakRSSBytes"`
}

// rate is the drain's events per second.
func (b PeerBig) rate() float64 {
	if b.Seconds <= 0 {
		return 0
	}
	return float64(b.Events) / b.Seconds
}

// big drains one n-event transaction through a fresh process of relay.
func (e peerEnv) big(ctx context.Context, relay string, n int) (PeerBig, error) {
	b := PeerBig{Relay: relay, Events: n}
	s, err := e.open(ctx, relay, fmt.Sprintf("bench_peers_big_%s_%d", relay, os.Getpid()))
	if err != nil {
		return b, err
	}
	defer s.close()
	if b.Seconds, err = e.drain(ctx, s.pool, s.mode, s.topic, n, s.ends); err != nil {
		return b, err
	}
	b.PeakRSS = peakRSS(s.pid)
	return b, nil
}
