package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ForExample is the setup of a runnable Example, which has no *testing.T: a
// fresh database in which setupSQL has run and sets are applied, and a fresh
// one-partition topic, plus one beside it for each of topicSuffixes (".dlt").
// It returns a pool on the database, the brokers and the topic's name, and a
// cleanup that drops them all. A failure panics, naming the command that
// starts the dev stack.
func ForExample(ctx context.Context, setupSQL string, sets []Migration, topicSuffixes ...string) (*pgxpool.Pool, []string, string, func()) {
	admin, brokers, name := PostgresAdminURL(), kafkaBrokers(), Name("example")
	must := func(err error) {
		if err != nil {
			panic(fmt.Sprintf("example setup (is the dev stack up? `make up`): %v", err))
		}
	}
	adminConn, err := pgx.Connect(ctx, admin)
	must(err)
	_, err = adminConn.Exec(ctx, "CREATE DATABASE "+name)
	must(err)
	cfg, err := pgxpool.ParseConfig(admin)
	must(err)
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	must(err)
	_, err = pool.Exec(ctx, setupSQL)
	must(err)
	must(Migrate(pool, sets...))
	ctrl, err := Controller(ctx, brokers)
	must(err)
	topics := []string{name}
	for _, s := range topicSuffixes {
		topics = append(topics, name+s)
	}
	for _, topic := range topics {
		cfg, err := TopicConfig(ctrl, topic, 1)
		must(err)
		must(ctrl.CreateTopics(cfg))
	}
	for deadline := time.Now().Add(20 * time.Second); ; <-time.After(20 * time.Millisecond) {
		parts, err := ctrl.ReadPartitions(name)
		if err == nil && len(parts) == 1 && parts[0].Leader.Host != "" {
			break
		}
		if time.Now().After(deadline) {
			must(fmt.Errorf("topic %s has no leader after 20s", name))
		}
	}
	return pool, brokers, name, func() {
		pool.Close()
		_, _ = adminConn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		adminConn.Close(ctx)
		_ = ctrl.DeleteTopics(topics...)
		ctrl.Close()
	}
}

// ExampleTB stands in for the *testing.T a runnable Example does not have,
// so that the kits' helpers (and NewPool, NewMigratedDatabase, WaitFor) work
// in one: a failure panics, and Done runs the cleanups, the last registered
// first. Call defer t.Done() right after NewExampleTB.
type ExampleTB struct {
	testing.TB // nil: only the methods below are called
	cleanups   []func()
}

// NewExampleTB returns an ExampleTB with no cleanups.
func NewExampleTB() *ExampleTB { return &ExampleTB{} }

// Helper does nothing: an example's failure has no test line to point at.
func (*ExampleTB) Helper() {}

// Fatalf panics with the message.
func (*ExampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// Errorf panics with the message.
func (*ExampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// Logf discards the message: an example's output is what it prints.
func (*ExampleTB) Logf(string, ...any) {}

// Cleanup registers f to run in Done.
func (t *ExampleTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

// Done runs the cleanups, the last registered first.
func (t *ExampleTB) Done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
