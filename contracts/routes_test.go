package contracts_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/contracts"
)

// The OpenAPI documents, from this module's directory.
var openAPIPaths = []string{"../docs/openapi-orders.yaml", "../docs/openapi-operator.yaml"}

// notDocumented are the routes the code registers that no document
// describes, each with the reason. Anything else the code registers must be
// in a document.
var notDocumented = map[string]string{
	"GET /charges/{orderId}":     "billing's read API: an internal convenience, not a contract offered to other teams",
	"POST /settlements":          "the third party's API, which the reconciler stand-in imitates: not ours to publish",
	"GET /settlements":           "the third party's stand-in",
	"GET /settlements/{key}":     "the third party's stand-in",
	"GET /stats":                 "the third party's stand-in",
	"GET /debug/pprof/cmdline":   "Go's net/http/pprof (PPROF=true), documented by Go",
	"GET /debug/pprof/profile":   "Go's net/http/pprof",
	"GET /debug/pprof/symbol":    "Go's net/http/pprof",
	"POST /debug/pprof/symbol":   "Go's net/http/pprof",
	"GET /debug/pprof/trace":     "Go's net/http/pprof",
	"GET /debug/pprof/{path...}": "Go's net/http/pprof",
}

// TestOpenAPIDocumentsAreTheRoutes: every route the services' and the
// platform's code registers (echo's e.GET("/path", …) and the like, the
// operator sub-routers' mux.HandleFunc("GET /path", …) under the prefix
// service.Mount gives them) is an operation of a document, unless
// notDocumented says why not; and every documented operation is a route of
// the code. A route added, renamed or removed without the documents fails
// here. The real services answering on those routes, on the listener each
// document names, is TestRealServicesMatchTheContracts.
func TestOpenAPIDocumentsAreTheRoutes(t *testing.T) {
	code := codeRoutes(t, "../services", "../platform")
	var documented []string
	for _, p := range openAPIPaths {
		o, err := contracts.LoadOpenAPI(p)
		if err != nil {
			t.Fatal(err)
		}
		documented = append(documented, o.Operations()...)
	}
	for _, r := range code {
		if _, skip := notDocumented[r]; skip {
			continue
		}
		if !slices.Contains(documented, r) {
			t.Errorf("the code registers %s, which no OpenAPI document (%s) describes: document it, or say why not in notDocumented",
				r, strings.Join(openAPIPaths, ", "))
		}
	}
	for _, r := range documented {
		if !slices.Contains(code, r) {
			t.Errorf("the documents describe %s, which the code does not register", r)
		}
	}
	if t.Failed() {
		t.Logf("the code's routes: %v", code)
	}
}

var echoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// codeRoutes returns the routes registered in the non-test Go files under
// dirs (the platform's harness and test infrastructure excepted), as
// "METHOD /path/{param}", sorted and without duplicates.
func codeRoutes(t *testing.T, dirs ...string) []string {
	t.Helper()
	type muxRoute struct{ pkg, route string }
	var routes []string
	var muxRoutes []muxRoute
	prefixes := map[string]string{} // package name -> the prefix service.Mount gives its handler
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "harness" || d.Name() == "testinfra" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) < 2 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				arg, _ := strconv.Unquote(lit.Value)
				switch sel.Sel.Name {
				case "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "Any":
					if strings.HasPrefix(arg, "/") {
						p := echoParam.ReplaceAllString(arg, "{$1}")
						if strings.HasSuffix(p, "/*") {
							p = strings.TrimSuffix(p, "*") + "{path...}"
						}
						routes = append(routes, sel.Sel.Name+" "+p)
					}
				case "HandleFunc", "Handle":
					if method, p, ok := strings.Cut(arg, " "); ok {
						muxRoutes = append(muxRoutes, muxRoute{f.Name.Name, method + " " + p})
					}
				case "Mount":
					if h, ok := call.Args[1].(*ast.CallExpr); ok {
						if hs, ok := h.Fun.(*ast.SelectorExpr); ok {
							if pkg, ok := hs.X.(*ast.Ident); ok {
								prefixes[pkg.Name] = arg
							}
						}
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range muxRoutes {
		prefix, ok := prefixes[r.pkg]
		if !ok {
			t.Errorf("package %s registers %s on a mux that no service.Mount mounts: where is it served?", r.pkg, r.route)
			continue
		}
		method, p, _ := strings.Cut(r.route, " ")
		routes = append(routes, method+" "+prefix+p)
	}
	slices.Sort(routes)
	return slices.Compact(routes)
}
