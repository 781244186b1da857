package inboxhttp_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/onceflow/onceflow/pkg/inbox/inboxhttp"
	"github.com/onceflow/onceflow/pkg/platform/apperr"
)

// FuzzDecodeRequeue feeds the dead-letter requeue decoder arbitrary bodies.
// Properties: no panic; a refusal is Malformed (400); an accepted request
// has no empty id list and at most MaxRequeueIDs ids, and decodes the same
// after encoding it again.
func FuzzDecodeRequeue(f *testing.F) {
	for _, seed := range []string{
		`{"topic":"orders","eventIds":["0198a6b4-6c3e-7c1e-9f0a-1b2c3d4e5f60"]}`, `{"topic":"orders","all":true}`,
		`{"topic":"orders","consumer":"billing"}`, `{"topic":"orders","eventIds":[]}`, `{"TOPIC":"orders"}`,
		`{"topic":"orders","eventIds":["nope"]}`, `{"topic":"\u0000"}`, `{"topic":"orders"} x`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := inboxhttp.DecodeRequeue(body)
		if err != nil {
			if ae, ok := apperr.As(err); !ok || ae.Code != apperr.Malformed {
				t.Fatalf("refusal %v is not a 400", err)
			}
			return
		}
		if (req.EventIDs != nil && len(req.EventIDs) == 0) || len(req.EventIDs) > inboxhttp.MaxRequeueIDs {
			t.Fatalf("accepted %+v: an empty id list or too many ids", req)
		}
		again, _ := json.Marshal(req)
		back, err := inboxhttp.DecodeRequeue(again)
		if err != nil || back.Topic != req.Topic || back.Consumer != req.Consumer || back.All != req.All ||
			!slices.Equal(back.EventIDs, req.EventIDs) {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, back, err, req)
		}
	})
}
