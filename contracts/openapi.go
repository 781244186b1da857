package contracts

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// OpenAPI is an OpenAPI 3.1 document loaded for checking responses. Its
// schemas are JSON Schema 2020-12 (OpenAPI 3.1's dialect), with formats
// asserted.
type OpenAPI struct {
	Doc map[string]any
	url string
	c   *jsonschema.Compiler
}

// LoadOpenAPI reads the document at path.
func LoadOpenAPI(path string) (*OpenAPI, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc, err := decodeYAML(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	o := &OpenAPI{Doc: doc, url: "urn:onceflow:openapi:" + path, c: jsonschema.NewCompiler()}
	o.c.DefaultDraft(jsonschema.Draft2020)
	o.c.AssertFormat()
	if err := o.c.AddResource(o.url, doc); err != nil {
		return nil, err
	}
	return o, nil
}

// Operations returns the document's operations as "METHOD /path/{param}",
// sorted.
func (o *OpenAPI) Operations() []string {
	var out []string
	paths, _ := o.Doc["paths"].(map[string]any)
	for p, item := range paths {
		for m := range item.(map[string]any) {
			switch m {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				out = append(out, strings.ToUpper(m)+" "+p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// CheckResponse validates a response of the operation method path (the
// document's path template) with status and JSON body: the status must be
// documented, and the body must validate against its application/json
// schema.
func (o *OpenAPI) CheckResponse(method, path string, status int, body []byte) error {
	op := "/paths/" + escape(path) + "/" + strings.ToLower(method)
	if _, err := Pointer(o.Doc, op); err != nil {
		return fmt.Errorf("%s %s is not in the document", method, path)
	}
	resp := op + "/responses/" + strconv.Itoa(status)
	r, err := Pointer(o.Doc, resp)
	if err != nil {
		return fmt.Errorf("%s %s answered %d, which the document does not list (%s)", method, path, status, body)
	}
	if ref, err := refOf(r); err == nil {
		resp = ref
	}
	schema := resp + "/content/application~1json/schema"
	if _, err := Pointer(o.Doc, schema); err != nil {
		return fmt.Errorf("%s %s %d: the document has no application/json schema for it", method, path, status)
	}
	s, err := o.c.Compile(o.url + "#" + schema)
	if err != nil {
		return fmt.Errorf("compiling %s: %w", schema, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s %s %d: the body is not JSON: %w (%s)", method, path, status, err, body)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s %s %d: the body %s: %w", method, path, status, body, err)
	}
	return nil
}

func escape(tok string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(tok)
}
