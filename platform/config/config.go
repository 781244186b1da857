// Package config loads a service's configuration from environment variables
// into a struct whose fields carry `env` and `envDefault` tags.
//
// It wraps github.com/caarlos0/env so that the environment is read through
// the getenv function a service's run receives, never from os.Getenv
// directly, and so that tests and docs can list every variable a service reads.
package config

import (
	"flag"
	"fmt"
	"io"
	"slices"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/platform/kafkautil"
	"github.com/onceflow/onceflow/platform/lifecycle"
)

// Var describes one environment variable a configuration reads.
type Var struct {
	Name    string
	Default string
}

// Load fills cfg (a pointer to a struct) from getenv, applying the
// envDefault of every variable getenv returns empty for.
func Load(getenv func(string) string, cfg any) error {
	vars, err := Vars(cfg)
	if err != nil {
		return err
	}
	environ := make(map[string]string, len(vars))
	for _, v := range vars {
		if val := getenv(v.Name); val != "" {
			environ[v.Name] = val
		}
	}
	if err := env.ParseWithOptions(cfg, env.Options{Environment: environ}); err != nil {
		return fmt.Errorf("reading configuration: %w", err)
	}
	return nil
}

// Vars lists the environment variables cfg (a pointer to a struct) reads.
func Vars(cfg any) ([]Var, error) {
	params, err := env.GetFieldParams(cfg)
	if err != nil {
		return nil, fmt.Errorf("listing configuration variables: %w", err)
	}
	vars := make([]Var, 0, len(params))
	for _, p := range params {
		vars = append(vars, Var{Name: p.Key, Default: p.DefaultValue})
	}
	return vars, nil
}

// KafkaSecurity reads the Kafka security variables (KAFKA_TLS, KAFKA_SASL_…;
// see kafkautil.SecurityConfig) from getenv and builds the security every
// Kafka client applies, for programs that have no Config struct of their
// own to embed kafkautil.SecurityConfig in.
func KafkaSecurity(getenv func(string) string) (kafkautil.Security, error) {
	var c kafkautil.SecurityConfig
	if err := Load(getenv, &c); err != nil {
		return kafkautil.Security{}, err
	}
	return kafkautil.NewSecurity(c)
}

// Read is how a program configured only by its environment starts: Args
// checks its command line (and answers -h), then Load fills cfg from getenv.
func Read(args []string, getenv func(string) string, stdout io.Writer, about string, cfg any) error {
	if err := Args(args, stdout, about, cfg); err != nil {
		return err
	}
	return Load(getenv, cfg)
}

// Args checks the command line of a program configured only by its
// environment (cfg, as Load reads it): -h, -help or --help prints the usage
// (about, then every variable with its default) to stdout and returns
// flag.ErrHelp, which lifecycle.ExitCode makes exit 0; any other argument is
// refused (lifecycle.ErrUsage), rather than ignored while the program
// starts as if nothing had been asked.
func Args(args []string, stdout io.Writer, about string, cfg any) error {
	if len(args) <= 1 {
		return nil
	}
	if !slices.Contains([]string{"-h", "-help", "--help"}, args[1]) {
		return fmt.Errorf("%w: %s takes no arguments, got %q: it is configured by environment variables (%s -h lists them)",
			lifecycle.ErrUsage, args[0], args[1:], args[0])
	}
	vars, err := Vars(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "usage: %s\n\n%s\n\nEnvironment (default):\n", args[0], about)
	for _, v := range vars {
		fmt.Fprintf(stdout, "  %s (%s)\n", v.Name, v.Default)
	}
	return flag.ErrHelp
}
