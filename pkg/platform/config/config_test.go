package config_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/platform/config"
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
