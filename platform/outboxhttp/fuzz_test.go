package outboxhttp_test

import (
	"encoding/json"
	"testing"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/outboxhttp"
)

// FuzzDecodeRequeue feeds the requeue decoder arbitrary bodies. Properties:
// no panic; a refusal is Malformed (400); an accepted request selects
// something explicitly (ids, a filter or all), within the per-call bound,
// and decodes the same after encoding it again.
func FuzzDecodeRequeue(f *testing.F) {
	for _, seed := range []string{
		`{"ids":[1,2,3]}`, `{"aggregateType":"order"}`, `{"aggregateType":"order","aggregateId":"o-1","limit":10}`,
		`{"all":true}`, `{"all":true,"limit":1000}`, `{}`, `{"ids":[]}`, `{"all":true,"limit":-1}`,
		`{"IDS":[1]}`, `{"ids":[1],"all":true}`, `{"aggregateType":"\u0000"}`, `{"ids":[1e400]}`, `{"ids":null}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := outboxhttp.DecodeRequeue(body)
		if err != nil {
			if ae, ok := apperr.As(err); !ok || ae.Code != apperr.Malformed {
				t.Fatalf("refusal %v is not a 400", err)
			}
			return
		}
		selects := len(req.IDs) > 0 || req.AggregateType != "" || req.All
		if !selects || len(req.IDs) > outboxhttp.MaxRequeue || req.Limit < 0 || req.Limit > outboxhttp.MaxRequeue {
			t.Fatalf("accepted %+v, which selects nothing explicitly or breaks the bound", req)
		}
		again, _ := json.Marshal(req)
		if _, err := outboxhttp.DecodeRequeue(again); err != nil {
			t.Fatalf("re-encoded %s is refused: %v", again, err)
		}
	})
}

// FuzzDecodeReplay: no panic; a refusal is Malformed; an accepted request
// has a window and decodes the same after encoding it again.
func FuzzDecodeReplay(f *testing.F) {
	for _, seed := range []string{
		`{"aggregateType":"order"}`, `{"aggregateType":"order","dryRun":false}`,
		`{"aggregateType":"order","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","dryRun":false}`,
		`{"aggregateType":"order","aggregateId":"o-1","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","dryRun":true}`,
		`{"from":"yesterday"}`, `{"DRYRUN":false}`, `{"dryRun":"false"}`, `{} {}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := outboxhttp.DecodeReplay(body)
		if err != nil {
			if ae, ok := apperr.As(err); !ok || ae.Code != apperr.Malformed {
				t.Fatalf("refusal %v is not a 400", err)
			}
			return
		}
		if req.From.IsZero() || req.To.IsZero() {
			t.Fatalf("accepted %+v, which has no window", req)
		}
		again, err := json.Marshal(req)
		if err != nil {
			return // a time outside what encoding/json writes; the window check refuses it later
		}
		back, err := outboxhttp.DecodeReplay(again)
		if err != nil || back.AggregateType != req.AggregateType || back.AggregateID != req.AggregateID ||
			!back.From.Equal(req.From) || !back.To.Equal(req.To) || (back.DryRun == nil) != (req.DryRun == nil) {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, back, err, req)
		}
	})
}
