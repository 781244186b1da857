package pgutil

import (
	"context"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// ServerWatch records which Postgres server a pool's new connections reach.
// With a multi-host DATABASE_URL (host1:port1,host2:port2 and
// target_session_attrs=read-write), pgx connects to whichever host is the
// primary now, so after a failover the connections the pool opens go to
// the promoted standby without a restart: the watch makes that visible, as
// service_postgres_server{server} (1 for the server the last connection
// reached, 0 for the others seen) and service_postgres_server_switches_total,
// and logs each switch.
type ServerWatch struct {
	logger   *slog.Logger
	server   *prometheus.GaugeVec
	switches prometheus.Counter

	mu   sync.Mutex
	last string
	seen map[string]bool
}

// NewServerWatch returns a watch that logs to logger; register its
// Collectors.
func NewServerWatch(logger *slog.Logger) *ServerWatch {
	return &ServerWatch{
		logger: logger,
		server: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "service_postgres_server",
			Help: "1 for the Postgres server (host:port) the service's last new connection reached, 0 for the others it reached before: a failover moves the 1.",
		}, []string{"server"}),
		switches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "service_postgres_server_switches_total",
			Help: "Times a new connection reached another Postgres server than the one before (a failover followed through the multi-host URL).",
		}),
		seen: map[string]bool{},
	}
}

// Collectors are the watch's metrics.
func (w *ServerWatch) Collectors() []prometheus.Collector {
	return []prometheus.Collector{w.server, w.switches}
}

// afterConnect is the pool's AfterConnect hook: it notes conn's server.
func (w *ServerWatch) afterConnect(ctx context.Context, conn *pgx.Conn) error {
	server := conn.PgConn().Conn().RemoteAddr().String()
	w.mu.Lock()
	defer w.mu.Unlock()
	if server == w.last {
		return nil
	}
	prev := w.last
	w.last = server
	for s := range w.seen {
		w.server.WithLabelValues(s).Set(0)
	}
	w.seen[server] = true
	w.server.WithLabelValues(server).Set(1)
	if prev != "" {
		w.switches.Inc()
		w.logger.WarnContext(ctx, "the database is served by another Postgres server now (a failover, followed through the multi-host URL)",
			slog.String("from", prev), slog.String("to", server))
	}
	return nil
}
