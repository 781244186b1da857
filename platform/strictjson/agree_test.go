package strictjson_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/strictjson"
)

// wide has a field of every kind the services' request bodies use, and an
// interface, whose numbers must stay json.Number (encoding/json's UseNumber).
type wide struct {
	Embedded
	ID     string            `json:"id"`
	IDs    []int64           `json:"ids"`
	UUIDs  []uuid.UUID       `json:"uuids"`
	At     time.Time         `json:"at"`
	DryRun *bool             `json:"dryRun"`
	Inner  *inner            `json:"inner"`
	Labels map[string]string `json:"labels"`
	Any    any               `json:"any"`
	Fixed  [2]int            `json:"fixed"`
}

// agreementBodies are bodies both decoders must treat alike, on top of
// TestUnmarshal's.
var agreementBodies = []string{
	`{"id":"a","ids":[1,2],"uuids":["6ba7b810-9dad-11d1-80b4-00c04fd430c8"],"at":"2026-01-02T03:04:05.123+02:00","dryRun":true}`,
	`{"ids":[]}`, `{"ids":null}`, `{"dryRun":null}`, `null`, `{}`, ` {"id":"a"} `,
	`{"any":{"n":12345678901234567890,"l":[1,2.5,-0,{"x":1e3}],"s":"x","b":true,"z":null}}`,
	`{"any":7}`, `{"any":[]}`, `{"labels":{"1":"a","":"b"}}`,
	`{"at":"2026-01-02T03:04:05,5Z"}`, `{"at":"2026-01-02 03:04:05Z"}`, `{"at":"yesterday"}`,
	`{"uuids":["nope"]}`, `{"ids":[1.5]}`, `{"ids":[99999999999999999999]}`, `{"ids":[1e2]}`,
	`{"fixed":[1]}`, `{"fixed":[1,2,3]}`, `{"inner":{"name":"a","name":"a"}}`,
	`{"any":{"k":1,"k":2}}`, `{"ID":"a"}`, `{"Embedded":{}}`, `{"region":"eu"}`,
	`{"id":"\u00e9\ud83d\ude00"}`, `{"id":"a\\u0000"}`, `{"any":"\u0000"}`, `{"any":{"\u0000":1}}`,
	`{"id":"a"}]`, `{"id":"a",}`, `{"id" "a"}`, `{'id':"a"}`, `{"id":"a"`, `"x"`, `[1]`, `1`, `true`,
	"{\"id\":\"a\x00\"}", "\xef\xbb\xbf{}", "{\"id\":\"\xc3\"}", "{}\xff",
}

// TestAgreesWithThreePass: the one-pass decoder accepts exactly what the
// three-pass one did, into the same value, and refuses the rest; the only
// difference is the escaped lone surrogate, which it refuses.
func TestAgreesWithThreePass(t *testing.T) {
	t.Parallel()
	for _, body := range agreementBodies {
		agree(t, []byte(body), func() any { return new(wide) })
		agree(t, []byte(body), func() any { return new(target) })
	}
	for _, body := range []string{`{"id":"\ud800"}`, `{"id":"\udc00x"}`, `{"any":{"\ud800":1}}`} {
		var v wide
		err := strictjson.Unmarshal([]byte(body), &v)
		if ae, ok := apperr.As(err); !ok || ae.Code != apperr.Malformed || !strings.Contains(ae.Message, "surrogate") {
			t.Errorf("Unmarshal(%s) = %v, want Malformed naming the lone surrogate", body, err)
		}
	}
}

// FuzzAgreesWithThreePass is TestAgreesWithThreePass on any body.
func FuzzAgreesWithThreePass(f *testing.F) {
	for _, body := range agreementBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		agree(t, body, func() any { return new(wide) })
		agree(t, body, func() any { return new(target) })
	})
}

func agree(t *testing.T, body []byte, newV func() any) {
	t.Helper()
	oldV, newValue := newV(), newV()
	oldErr := strictjson.ThreePassUnmarshal(body, oldV)
	newErr := strictjson.Unmarshal(body, newValue)
	switch {
	case oldErr == nil && newErr != nil && strings.Contains(newErr.Error(), "surrogate"):
		// encoding/json took an escaped lone surrogate as U+FFFD.
	case (oldErr == nil) != (newErr == nil):
		t.Fatalf("%T from %q: three-pass says %v, one-pass says %v", newValue, body, oldErr, newErr)
	case newErr != nil:
		ae, ok := apperr.As(newErr)
		if !ok || ae.Code != apperr.Malformed || len(ae.Message) > 4*apperr.MaxQuote+100 {
			t.Fatalf("%T from %q: refusal %v is not a short Malformed", newValue, body, newErr)
		}
	case !reflect.DeepEqual(oldV, newValue):
		t.Fatalf("%T from %q: three-pass decodes %+v, one-pass %+v", newValue, body, oldV, newValue)
	}
}
