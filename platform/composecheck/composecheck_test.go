package composecheck

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/platform/config"
)

// writeCompose writes a Compose file for one test and returns its path.
func writeCompose(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "docker-compose.yml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

type composeTestConfig struct {
	HTTPAddr    string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://127.0.0.1/db"`
	Workers     int    `env:"WORKERS" envDefault:"4"`
}

const composeFile = `
x-common: &common
  LOG_LEVEL: info
services:
  good:
    image: example
    environment:
      HTTP_ADDR: 0.0.0.0:8080
      DATABASE_URL: postgres://postgres/db
      WORKERS: 8
  typos:
    environment:
      HTTP_ADDR: 0.0.0.0:8080
      WORKER: 8
      DATABASE_URL: ""
      LOG_LEVL: debug
  merged:
    environment:
      <<: *common
      PASSED_THROUGH:
  listed:
    environment:
      - HTTP_ADDR=0.0.0.0:8080
  bare:
    image: example
`

func TestReadComposeEnvMapForm(t *testing.T) {
	t.Parallel()
	path := writeCompose(t, composeFile)
	for _, tc := range []struct {
		service string
		want    map[string]string
	}{
		{"good", map[string]string{"HTTP_ADDR": "0.0.0.0:8080", "DATABASE_URL": "postgres://postgres/db", "WORKERS": "8"}},
		{"merged", map[string]string{"LOG_LEVEL": "info", "PASSED_THROUGH": ""}},
		{"bare", map[string]string{}},
	} {
		t.Run(tc.service, func(t *testing.T) {
			got, err := readEnv(path, tc.service)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReadComposeEnvRejects(t *testing.T) {
	t.Parallel()
	path := writeCompose(t, composeFile)
	for _, tc := range []struct {
		service, wantErr string
	}{
		{"listed", "write it as a map"},
		{"missing", `no service "missing" (services: bare, good, listed, merged, typos)`},
	} {
		t.Run(tc.service, func(t *testing.T) {
			_, err := readEnv(path, tc.service)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestComposeEnvProblems(t *testing.T) {
	t.Parallel()
	path := writeCompose(t, composeFile)
	env, err := readEnv(path, "typos")
	if err != nil {
		t.Fatal(err)
	}
	reads, err := config.Vars(&composeTestConfig{})
	if err != nil {
		t.Fatal(err)
	}
	missing, unknown := composeEnvProblems(env, reads)
	// An empty DATABASE_URL is missing: the program would use its default.
	if want := []string{"DATABASE_URL", "WORKERS"}; !reflect.DeepEqual(missing, want) {
		t.Errorf("missing = %v, want %v", missing, want)
	}
	if want := []string{"LOG_LEVL", "WORKER"}; !reflect.DeepEqual(unknown, want) {
		t.Errorf("unknown = %v, want %v", unknown, want)
	}
}

func TestCheckComposeEnvPasses(t *testing.T) {
	t.Parallel()
	CheckEnv(t, writeCompose(t, composeFile), "good", &composeTestConfig{})
}

// errorRecorder keeps what CheckComposeEnv reports instead of failing the test.
type errorRecorder struct {
	testing.TB
	errors []string
}

func (r *errorRecorder) Helper() {}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestCheckComposeEnvNamesEveryProblem(t *testing.T) {
	t.Parallel()
	rec := &errorRecorder{TB: t}
	CheckEnv(rec, writeCompose(t, composeFile), "typos", &composeTestConfig{})
	if len(rec.errors) != 2 ||
		!strings.Contains(rec.errors[0], "does not set DATABASE_URL, WORKERS,") ||
		!strings.Contains(rec.errors[1], "sets LOG_LEVL, WORKER,") {
		t.Fatalf("got %q, want one error naming DATABASE_URL, WORKERS and one naming LOG_LEVL, WORKER", rec.errors)
	}
}
