// Command apisurface counts what a package exports, the first figure of
// docs/library-shape.md: a library an adopter reads in an hour exports few
// names (issue 31 aims at 25 or fewer for pkg/outbox and pkg/inbox).
//
//	go run ./tools/cmd/apisurface pkg/outbox pkg/inbox
//
// For each directory it reads the non-test .go files (whatever their build
// tags) and prints the exported top-level names (each constant, variable,
// function and type counts once, as `go doc -short` would list them if it
// did not fold groups) and, apart, the exported methods of exported types.
// -v lists the names.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "apisurface:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("apisurface", flag.ContinueOnError)
	verbose := fs.Bool("v", false, "list the names")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, dir := range fs.Args() {
		top, methods, err := surface(dir)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\t%d names\t%d methods\n", dir, len(top), len(methods))
		if *verbose {
			for _, n := range top {
				fmt.Fprintf(stdout, "\t%s\n", n)
			}
			for _, n := range methods {
				fmt.Fprintf(stdout, "\t%s\n", n)
			}
		}
	}
	return nil
}

// surface returns the sorted exported top-level names of the package in dir
// and its exported methods on exported types, as Type.Method.
func surface(dir string) (top, methods []string, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, nil, err
	}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	add := func(list *[]string, name string) {
		if !seen[name] {
			seen[name] = true
			*list = append(*list, name)
		}
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					add(&top, d.Name.Name)
					continue
				}
				if recv := receiver(d.Recv.List[0].Type); ast.IsExported(recv) {
					add(&methods, recv+"."+d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							add(&top, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								add(&top, n.Name)
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(top)
	sort.Strings(methods)
	return top, methods, nil
}

// receiver names the type of a method's receiver, without pointer or type
// parameters.
func receiver(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiver(e.X)
	case *ast.IndexExpr:
		return receiver(e.X)
	case *ast.IndexListExpr:
		return receiver(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}
