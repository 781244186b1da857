package inboxhttp_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/inboxhttp"
)

// FuzzDecodeRequeue feeds the dead-letter requeue decoder arbitrary bodies.
// Properties: no panic; a refusal is Malformed (400); an accepted request
// has no empty id list and at most MaxRequeueIDs ids, selects something, has
// a limit from 0 to inboxadmin.MaxRequeueLimit, and decodes the same after
// encoding it again.
func FuzzDecodeRequeue(f *testing.F) {
	for _, seed := range []string{
		`{"topic":"orders","eventIds":["0198a6b4-6c3e-7c1e-9f0a-1b2c3d4e5f60"]}`, `{"topic":"orders","all":true}`,
		`{"topic":"orders","consumer":"billing"}`, `{"topic":"orders","eventIds":[]}`, `{"TOPIC":"orders"}`,
		`{"topic":"orders","eventIds":["nope"]}`, `{"topic":"\u0000"}`, `{"topic":"orders"} x`, `{}`,
		`{"topic":"orders","all":true,"limit":1000,"after":"0:1000:2500,1:0:800"}`, `{"all":true,"limit":-1}`,
		`{"all":true,"after":"1:0:5,0:0:5"}`, `{"consumer":"billing","after":"0:9223372036854775807:1"}`,
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
		if (!req.All && req.Consumer == "" && len(req.EventIDs) == 0) || req.Limit < 0 || req.Limit > inboxadmin.MaxRequeueLimit {
			t.Fatalf("accepted %+v: it selects nothing or its limit is out of range", req)
		}
		again, _ := json.Marshal(req)
		back, err := inboxhttp.DecodeRequeue(again)
		if err != nil || back.Topic != req.Topic || back.Consumer != req.Consumer || back.All != req.All ||
			back.Limit != req.Limit || back.After != req.After ||
			!slices.Equal(back.EventIDs, req.EventIDs) {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, back, err, req)
		}
	})
}
