package metrics

import "github.com/prometheus/client_golang/prometheus"

// CDC are the metrics only the log-based relay moves.
type CDC struct {
	RetainedWAL, WalKeepSize prometheus.Gauge
	LostUnrecoverable        prometheus.Counter
	GapRepublished           prometheus.Counter
	PublicationMissing       prometheus.Counter
	EmittedRefused           *prometheus.CounterVec
}

// Reasons an emitted message under EmitPrefix is refused
// (outbox_emitted_refused_total's reason label).
const (
	RefusedUndecodable      = "undecodable"       // in neither of the encodings Emit writes
	RefusedInvalid          = "invalid"           // decoded, but not a complete envelope
	RefusedNonTransactional = "non_transactional" // Emit writes transactional messages only
)

func newCDC(reg prometheus.Registerer) *CDC {
	m := &CDC{
		RetainedWAL: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_slot_retained_wal_bytes",
			Help: "WAL the log-based relay's slot keeps from being recycled: pg_current_wal_lsn() - restart_lsn. " +
				"Postgres invalidates the slot (its events are then lost or must be republished) when this passes max_slot_wal_keep_size."}),
		WalKeepSize: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_slot_wal_keep_size_bytes",
			Help: "The server's max_slot_wal_keep_size in bytes, as the log-based relay reads it; +Inf when unlimited (a slot then fills the disk instead); 0 until a log-based relay read it."}),
		LostUnrecoverable: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_slot_lost_unrecoverable_total",
			Help: "Lost replication slots in WAL-only mode (RELAY_MODE=wal): the events Emit wrote in the window were never published and exist nowhere else."}),
		GapRepublished: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_slot_gap_republished_total",
			Help: "Pending outbox rows the log-based relay republished from the table because a new slot's stream could not carry them (a lost slot's window)."}),
		PublicationMissing: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_slot_publication_missing_total",
			Help: "Streams of the log-based relay that failed on a change committed while the publication outbox_events_pub was missing (42704): " +
				"the slot cannot move past it until an operator drops the slot (docs/runbook-cdc.md)."}),
		EmittedRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_emitted_refused_total",
			Help: "Messages under the outbox's prefix in the WAL that are not valid envelopes, by reason (undecodable, invalid, non_transactional): " +
				"never published, counted dead in outbox_dead_total. Only Emit should write there; anything else was written by hand."},
			[]string{"reason"}),
	}
	for _, reason := range []string{RefusedUndecodable, RefusedInvalid, RefusedNonTransactional} {
		m.EmittedRefused.WithLabelValues(reason) // export zeros, so increase() works from the start
	}
	if reg != nil {
		reg.MustRegister(m.RetainedWAL, m.WalKeepSize, m.LostUnrecoverable, m.GapRepublished, m.PublicationMissing, m.EmittedRefused)
	}
	return m
}
