package service

import (
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/platform/inboxhttp"
	"github.com/onceflow/onceflow/platform/lifecycle"
	"github.com/onceflow/onceflow/platform/outboxhttp"
)

// OutboxOperations is what every service with an outbox runs beside its
// relay: the operator routes under /admin/outbox (list, requeue, replay;
// see outboxhttp) for the relay's mode, and the outbox pruner, which prune
// configures. It returns the pruner's stage for Run.
func (s *Service) OutboxOperations(mode outbox.RelayMode, prune outbox.PruneConfig) (lifecycle.Stage, error) {
	pruner, err := outbox.NewPruner(s.Pool, outbox.PrunerConfig{PruneConfig: prune, Logger: s.Logger})
	if err != nil {
		return lifecycle.Stage{}, err
	}
	s.Mount("/admin/outbox", outboxhttp.Handler(s.Pool, mode, s.Logger))
	return lifecycle.Stage{Name: "outbox pruner", Run: pruner.Run}, nil
}

// InboxOperations is what every service with an inbox runs beside its
// consumer: the operator routes under /admin/inbox (list and requeue dead
// letters; see inboxhttp) for topic, whose dead letters are in topic+".dlt"
// and are requeued through w, and the inbox pruner at its defaults. It
// returns the pruner's stage for Run.
func (s *Service) InboxOperations(w inboxadmin.Writer, topic string) (lifecycle.Stage, error) {
	pruner, err := inbox.NewPruner(s.Pool, inbox.PrunerConfig{Logger: s.Logger})
	if err != nil {
		return lifecycle.Stage{}, err
	}
	s.Mount("/admin/inbox", inboxhttp.Handler(s.Pool, w, s.opts.KafkaBrokers, map[string]string{topic: topic + ".dlt"},
		s.Logger, inboxadmin.WithDialer(s.opts.Kafka.Dialer())))
	return lifecycle.Stage{Name: "inbox pruner", Run: pruner.Run}, nil
}
