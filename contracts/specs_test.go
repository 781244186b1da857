package contracts_test

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

// TestDocumentsAreValidAsyncAPIAndOpenAPI validates the documents against
// the specifications' own JSON Schemas (testdata/specs), so that what a
// consumer feeds its generator or validator is well formed: a Kafka key
// given as a $ref, for instance, matches both a Reference and a Schema
// object, which AsyncAPI 3.0 refuses.
func TestDocumentsAreValidAsyncAPIAndOpenAPI(t *testing.T) {
	for _, c := range []struct{ doc, spec string }{
		{asyncAPIPath, "testdata/specs/asyncapi-3.0.0.json"},
		{"../docs/openapi-orders.yaml", "testdata/specs/openapi-3.1.json"},
		{"../docs/openapi-operator.yaml", "testdata/specs/openapi-3.1.json"},
	} {
		s, err := jsonschema.NewCompiler().Compile(c.spec)
		if err != nil {
			t.Fatalf("compiling %s: %v", c.spec, err)
		}
		raw, err := os.ReadFile(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		var y any
		if err := yaml.Unmarshal(raw, &y); err != nil {
			t.Fatalf("%s: %v", c.doc, err)
		}
		j, err := json.Marshal(y)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Validate(doc); err != nil {
			t.Errorf("%s is not valid against %s:\n%v", c.doc, c.spec, err)
		}
	}
}
