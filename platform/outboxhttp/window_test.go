package outboxhttp_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/outboxhttp"
	"github.com/onceflow/onceflow/platform/testinfra"
)

// A replay always takes a window, and one call replays at most
// outboxhttp.MaxReplay events: a body with only an aggregate type once
// matched a whole history, and with "dryRun": false would have republished
// it. Past the cap the answer is a 422 that states the cap.
func TestReplayNeedsAWindowAndIsCapped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.NewDatabase(t)
	const limit = outboxhttp.MaxReplay
	// limit+1 published events of one aggregate type, in one statement.
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
                           payload, occurred_at, partition, state, published_at)
SELECT gen_random_uuid(), 'thing', 't-' || i, 1, 'ThingHappened', 1, '{}', now(), 0, 'published', now()
FROM generate_series(1, $1) AS i`, limit+1); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(modeHandler(pool, outbox.ModePoll))
	defer srv.Close()
	from := time.Now().Add(-time.Hour).Format(time.RFC3339Nano)
	to := time.Now().Add(time.Hour).Format(time.RFC3339Nano)

	for _, body := range []string{
		`{"aggregateType":"thing","dryRun":false}`,
		`{"aggregateType":"thing","dryRun":true}`,
		`{"aggregateType":"thing","from":"` + from + `","dryRun":false}`,
		`{"aggregateType":"thing","to":"` + to + `","dryRun":false}`,
	} {
		got := testinfra.CallJSON(t, "POST", srv.URL+"/replay", body, 400)
		if msg := fmt.Sprint(got["error"]); !strings.Contains(msg, `"from" and "to" are required`) {
			t.Errorf("%s: the refusal %v does not say that from and to are required", body, got)
		}
	}
	for _, dry := range []string{"true", "false"} {
		body := `{"aggregateType":"thing","from":"` + from + `","to":"` + to + `","dryRun":` + dry + `}`
		got := testinfra.CallJSON(t, "POST", srv.URL+"/replay", body, 422)
		if msg := fmt.Sprint(got["error"]); !strings.Contains(msg, fmt.Sprint(limit)) {
			t.Errorf("dryRun %s: the refusal %v does not state the cap (%d)", dry, got, limit)
		}
	}
	var published int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE state = 'published'`).Scan(&published); err != nil {
		t.Fatal(err)
	}
	if published != limit+1 {
		t.Fatalf("%d of %d events still published after refused replays", published, limit+1)
	}
	// Within the cap, the same window is replayed.
	one := `{"aggregateType":"thing","aggregateId":"t-7","from":"` + from + `","to":"` + to + `","dryRun":false}`
	if got := testinfra.CallJSON(t, "POST", srv.URL+"/replay", one, 200); got["count"] != float64(1) {
		t.Fatalf("replay of one aggregate = %v, want count 1", got)
	}
}
