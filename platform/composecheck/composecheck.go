// Package composecheck keeps docker-compose.yml and the harness's program
// specs honest: a test per program checks that the Compose service sets
// every environment variable the program reads, and nothing it does not,
// and that the program's harness.Spec names only variables it reads.
package composecheck

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/onceflow/onceflow/platform/config"
	"github.com/onceflow/onceflow/platform/harness"
)

// CheckProgram checks one program against its configuration cfg (a pointer
// to its Config struct): CheckEnv on the Compose service, and the
// program's harness.Spec (the one whose Compose is service) against the
// variables cfg reads (harness.CheckSpec). One test per program then keeps
// both descriptions of its environment, the Compose file and the
// harness's, in line with the code.
func CheckProgram(t testing.TB, composePath, service string, cfg any) {
	t.Helper()
	CheckEnv(t, composePath, service, cfg)
	i := slices.IndexFunc(harness.Programs, func(s harness.Spec) bool { return s.Compose == service })
	if i < 0 {
		t.Fatalf("platform/harness has no program spec for the Compose service %q", service)
	}
	reads, err := config.Vars(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	names := make([]string, len(reads))
	for j, v := range reads {
		names[j] = v.Name
	}
	if err := harness.CheckSpec(harness.Programs[i], names); err != nil {
		t.Errorf("%v (platform/harness/spec.go)", err)
	}
}

// Env returns the environment that the Docker Compose file at
// composePath gives service. It fails the test when the file cannot be read,
// the service is not in it, or the service's environment is written in the
// list form ("- KEY=value"): the map form (KEY: value) is the one this
// project uses, because it is the one a YAML parser reads without guessing.
func Env(t testing.TB, composePath, service string) map[string]string {
	t.Helper()
	env, err := readEnv(composePath, service)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return env
}

// CheckEnv fails the test when service in the Compose file at
// composePath does not set every variable cfg (a pointer to a config struct)
// reads, or sets one that cfg does not read. The first catches a container
// that silently falls back to a default meant for the dev stack (127.0.0.1);
// the second catches a typo'd name, which the program would otherwise ignore.
func CheckEnv(t testing.TB, composePath, service string, cfg any) {
	t.Helper()
	env := Env(t, composePath, service)
	reads, err := config.Vars(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	missing, unknown := composeEnvProblems(env, reads)
	if len(missing) > 0 {
		t.Errorf("%s: service %q does not set %s, which the program reads; set each explicitly, "+
			"because the defaults point at the dev stack on 127.0.0.1, not at the other containers",
			composePath, service, strings.Join(missing, ", "))
	}
	if len(unknown) > 0 {
		t.Errorf("%s: service %q sets %s, which the program does not read (a typo, or a variable it no longer has)",
			composePath, service, strings.Join(unknown, ", "))
	}
}

// composeEnvProblems compares the environment a service is given with the
// variables its program reads, both sorted by name. An empty value counts as
// missing: config.Load treats it as unset and applies the default.
func composeEnvProblems(env map[string]string, reads []config.Var) (missing, unknown []string) {
	read := make(map[string]bool, len(reads))
	for _, v := range reads {
		read[v.Name] = true
		if env[v.Name] == "" {
			missing = append(missing, v.Name)
		}
	}
	for name := range env {
		if !read[name] {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(unknown)
	return missing, unknown
}

// readEnv is Env without the test: the environment of service
// in the Compose file at path, each value as the string the container gets.
func readEnv(path, service string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading compose file: %w", err)
	}
	var file struct {
		Services map[string]struct {
			Environment yaml.Node `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("parsing compose file %s: %w", path, err)
	}
	svc, ok := file.Services[service]
	if !ok {
		names := make([]string, 0, len(file.Services))
		for name := range file.Services {
			names = append(names, name)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("%s: no service %q (services: %s)", path, service, strings.Join(names, ", "))
	}

	node := &svc.Environment
	switch node.Kind {
	case 0: // no environment key at all
		return map[string]string{}, nil
	case yaml.MappingNode:
	case yaml.SequenceNode:
		return nil, fmt.Errorf("%s: service %q lists its environment (- KEY=value); write it as a map (KEY: value)", path, service)
	default:
		return nil, fmt.Errorf("%s: service %q: environment (line %d) is not a map of KEY: value", path, service, node.Line)
	}
	// Decoding into a map applies YAML merge keys (<<: *anchor) the way
	// Compose does; values stay nodes so that numbers keep their spelling.
	var raw map[string]yaml.Node
	if err := node.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%s: service %q: environment: %w", path, service, err)
	}
	env := make(map[string]string, len(raw))
	for name, value := range raw {
		switch {
		case value.Kind == yaml.ScalarNode && value.ShortTag() == "!!null":
			// "KEY:" with no value passes the host's KEY through, if it has one.
			env[name] = ""
		case value.Kind == yaml.ScalarNode:
			env[name] = value.Value
		default:
			return nil, fmt.Errorf("%s: service %q: environment %s (line %d) is not a single value", path, service, name, value.Line)
		}
	}
	return env, nil
}
