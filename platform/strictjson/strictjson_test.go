package strictjson_test

import (
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/strictjson"
)

type inner struct {
	Name string `json:"name"`
}

type Embedded struct {
	Region string `json:"region"`
}

type target struct {
	Embedded
	ID      string            `json:"id"`
	Count   int               `json:"count,omitempty"`
	Untaged string            // matched by its Go name, exactly
	Skip    string            `json:"-"`
	Inner   inner             `json:"inner"`
	List    []inner           `json:"list"`
	Ptr     *inner            `json:"ptr"`
	Labels  map[string]string `json:"labels"`
	At      time.Time         `json:"at"`
}

func TestUnmarshal(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, body string
		want       string // "" = accepted; else a substring of the Malformed message
	}{
		{"everything", `{"id":"a","count":1,"Untaged":"u","region":"eu","inner":{"name":"n"},"list":[{"name":"m"}],"ptr":{"name":"p"},"labels":{"Any Key":"v"},"at":"2026-01-02T03:04:05Z"}`, ""},
		{"null values", `{"ptr":null,"list":null,"inner":null}`, ""},
		{"upper-case key", `{"ID":"a"}`, `unknown field "ID"`},
		{"case of an untagged field", `{"untaged":"u"}`, `unknown field "untaged"`},
		{"case of an embedded field", `{"Region":"eu"}`, `unknown field "Region"`},
		{"case in a nested object", `{"inner":{"Name":"n"}}`, `unknown field "inner.Name"`},
		{"case in an array element", `{"list":[{"name":"a"},{"NAME":"b"}]}`, `unknown field "list[1].NAME"`},
		{"case behind a pointer", `{"ptr":{"nAme":"x"}}`, `unknown field "ptr.nAme"`},
		{"skipped field", `{"Skip":"x"}`, `unknown field "Skip"`},
		{"unknown field", `{"id":"a","extra":1}`, `unknown field "extra"`},
		{"NUL in a value", `{"id":"a\u0000"}`, "NUL"},
		{"NUL in a map key", `{"labels":{"k\u0000":"v"}}`, "NUL"},
		{"NUL in a map value", `{"labels":{"k":"\u0000"}}`, "NUL"},
		{"NUL in a nested array", `{"list":[{"name":"\u0000"}]}`, "NUL"},
		{"invalid UTF-8", "{\"id\":\"\xc3\x28\"}", "UTF-8"},
		{"trailing object", `{"id":"a"}{"id":"b"}`, "after the JSON object"},
		{"trailing garbage", `{"id":"a"} x`, "after the JSON object"},
		{"trailing whitespace", "{\"id\":\"a\"}\n\t ", ""},
		{"empty", "  ", "empty"},
		{"truncated", `{"id":`, "not valid JSON"},
		{"wrong type", `{"count":"1"}`, "count must be an integer"},
		{"not an object", `[]`, "the body must be an object, got a JSON array"},
		{"unknown nested field", `{"inner":{"zzz":1}}`, `unknown field "inner.zzz"`},
		{"wrong type in an array element", `{"list":[{"name":1}]}`, "list[0].name must be a string, got a JSON number"},
		{"fraction for an integer", `{"count":1.5}`, `count must be an integer, got the JSON number "1.5"`},
		{"wrong type in a map", `{"labels":{"a":1}}`, "labels.a must be a string"},
		{"lone surrogate", `{"id":"\ud800"}`, "surrogate"},
		{"bad time", `{"at":"yesterday"}`, "not valid JSON for this endpoint"},
		{"duplicate key", `{"id":"a","count":1,"id":"b"}`, `field "id" appears twice`},
		{"duplicate key in a nested object", `{"inner":{"name":"a","name":"b"}}`, `field "inner.name" appears twice`},
		{"duplicate key in an array element", `{"list":[{"name":"a"},{"name":"b","name":"c"}]}`, `field "list[1].name" appears twice`},
		{"duplicate map key", `{"labels":{"k":"v","k":"w"}}`, `field "labels.k" appears twice`},
		{"same key in two objects", `{"inner":{"name":"a"},"ptr":{"name":"b"}}`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var v target
			err := strictjson.Unmarshal([]byte(tt.body), &v)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			ae, ok := apperr.As(err)
			if !ok || ae.Code != apperr.Malformed || !strings.Contains(ae.Message, tt.want) {
				t.Fatalf("Unmarshal(%s) = %v, want Malformed mentioning %q", tt.body, err, tt.want)
			}
		})
	}
}

// An error quotes at most apperr.MaxQuote bytes of what the client sent.
func TestErrorsDoNotEchoTheInput(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("K", 100_000)
	for _, body := range []string{`{"` + long + `":1}`, `{"at":"` + long + `"}`, `{"inner":{"` + long + `":1}}`,
		`{"labels":{"` + long + `":1}}`, `{"count":1` + strings.Repeat("1", 100_000) + `.5}`,
		`{"labels":{"` + long + `":"a","` + long + `":"b"}}`, `{"labels":{"` + long + `":"\u0000"}}`} {
		var v target
		err := strictjson.Unmarshal([]byte(body), &v)
		if err == nil || len(err.Error()) > 400 {
			t.Fatalf("error for a 100 KB name or value is %d bytes: %.200q", len(err.Error()), err)
		}
	}
}
