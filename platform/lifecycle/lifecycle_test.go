package lifecycle_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/platform/lifecycle"
)

// recorder is a set of stages that log when they stop.
type recorder struct {
	mu      sync.Mutex
	stopped []string
}

func (r *recorder) stage(name string, fail error) lifecycle.Stage {
	return lifecycle.Stage{Name: name, Run: func(ctx context.Context) error {
		if fail != nil {
			return fail
		}
		<-ctx.Done()
		r.mu.Lock()
		r.stopped = append(r.stopped, name)
		r.mu.Unlock()
		return nil
	}}
}

func TestStagesStopInOrder(t *testing.T) {
	var r recorder
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := lifecycle.Run(ctx, r.stage("http", nil), r.stage("consumer", nil), r.stage("relay", nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http", "consumer", "relay"}; !reflect.DeepEqual(r.stopped, want) {
		t.Fatalf("stopped %v, want %v", r.stopped, want)
	}
}

func TestAFailingStageStopsTheRest(t *testing.T) {
	var r recorder
	boom := errors.New("boom")
	err := lifecycle.Run(context.Background(), r.stage("http", nil), r.stage("consumer", boom), r.stage("relay", nil))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if want := []string{"http", "relay"}; !reflect.DeepEqual(r.stopped, want) {
		t.Fatalf("stopped %v, want %v", r.stopped, want)
	}
}

func TestAStageReturningEarlyIsAnError(t *testing.T) {
	early := lifecycle.Stage{Name: "relay", Run: func(context.Context) error { return nil }}
	if err := lifecycle.Run(context.Background(), early); err == nil {
		t.Fatal("want an error when a stage returns before it was asked to stop")
	}
}
