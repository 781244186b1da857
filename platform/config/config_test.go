package config_test

import (
	"errors"
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/platform/config"
	"github.com/onceflow/onceflow/platform/lifecycle"
)

type sample struct {
	Addr    string        `env:"HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	Timeout time.Duration `env:"TIMEOUT" envDefault:"5s"`
	Brokers []string      `env:"BROKERS" envDefault:"a:1,b:2"`
}

func TestLoadAppliesDefaultsAndOverrides(t *testing.T) {
	t.Parallel()
	var c sample
	getenv := func(k string) string { return map[string]string{"TIMEOUT": "2m"}[k] }
	if err := config.Load(getenv, &c); err != nil {
		t.Fatal(err)
	}
	want := sample{Addr: "127.0.0.1:8080", Timeout: 2 * time.Minute, Brokers: []string{"a:1", "b:2"}}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v, want %+v", c, want)
	}
}

func TestLoadRejectsBadValue(t *testing.T) {
	t.Parallel()
	var c sample
	getenv := func(k string) string { return map[string]string{"TIMEOUT": "soon"}[k] }
	if err := config.Load(getenv, &c); err == nil {
		t.Fatal("want an error for TIMEOUT=soon")
	}
}

func TestVars(t *testing.T) {
	t.Parallel()
	vars, err := config.Vars(&sample{})
	if err != nil {
		t.Fatal(err)
	}
	want := []config.Var{{"HTTP_ADDR", "127.0.0.1:8080"}, {"TIMEOUT", "5s"}, {"BROKERS", "a:1,b:2"}}
	if !reflect.DeepEqual(vars, want) {
		t.Fatalf("got %+v, want %+v", vars, want)
	}
}

// A program configured by its environment answers -h with its variables
// (exit 0 through flag.ErrHelp) and refuses any other argument, instead of
// starting as if nothing had been asked.
func TestArgs(t *testing.T) {
	t.Parallel()
	type cfg struct {
		Addr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8081"`
	}
	var out strings.Builder
	if err := config.Args([]string{"orders"}, &out, "about", &cfg{}); err != nil || out.Len() != 0 {
		t.Fatalf("no arguments: %v %q, want nil and nothing printed", err, out.String())
	}
	for _, h := range []string{"-h", "-help", "--help"} {
		out.Reset()
		err := config.Args([]string{"orders", h}, &out, "The orders service.", &cfg{})
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "usage: orders") ||
			!strings.Contains(out.String(), "HTTP_ADDR (127.0.0.1:8081)") || !strings.Contains(out.String(), "The orders service.") {
			t.Fatalf("%s: %v\n%s", h, err, out.String())
		}
	}
	if err := config.Args([]string{"orders", "serve"}, &out, "", &cfg{}); !errors.Is(err, lifecycle.ErrUsage) {
		t.Fatalf("an argument: %v, want lifecycle.ErrUsage", err)
	}
}
