package orders_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/services/orders"
)

// FuzzDecodePlaceRequest feeds the order request decoder arbitrary bodies.
// Properties: no panic; every refusal is an apperr Malformed or Invalid (a
// 4xx, never a 500); an accepted request is valid, holds only text Postgres
// stores (valid UTF-8, no NUL), and decodes the same after encoding it again.
func FuzzDecodePlaceRequest(f *testing.F) {
	for _, seed := range []string{
		`{"customerId":"cust-1","amountCents":1999,"currency":"EUR"}`,
		`{"customerId":"c","amountCents":1,"currency":"JPY"}` + "\n",
		`{"CUSTOMERID":"c","amountCents":1,"currency":"EUR"}`,
		`{"customerId":"c\u0000","amountCents":1,"currency":"EUR"}`,
		"{\"customerId\":\"c\xff\",\"amountCents\":1,\"currency\":\"EUR\"}",
		`{"customerId":"c","amountCents":1.5,"currency":"EUR"}`,
		`{"customerId":"c","amountCents":1e3,"currency":"EUR"}`,
		`{"customerId":"c","amountCents":1,"currency":"EUR"}{}`,
		`{"customerId":"c","amountCents":1,"currency":"EUR","customerId":"d"}`,
		`[]`, `null`, ``, `{`, `"x"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := orders.DecodePlaceRequest(bytes.NewReader(body))
		if err != nil {
			ae, ok := apperr.As(err)
			if !ok || (ae.Code != apperr.Malformed && ae.Code != apperr.Invalid) {
				t.Fatalf("refusal %v is not a 400 or 422", err)
			}
			if len(ae.Message) > 512 {
				t.Fatalf("the message is %d bytes long: it echoes the input", len(ae.Message))
			}
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted %+v, which does not validate: %v", req, err)
		}
		for _, s := range []string{req.CustomerID, req.Currency} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("accepted %q, which Postgres refuses", s)
			}
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		back, err := orders.DecodePlaceRequest(bytes.NewReader(again))
		if err != nil || back != req {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, back, err, req)
		}
	})
}
