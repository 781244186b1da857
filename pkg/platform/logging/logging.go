// Package logging builds the JSON slog logger every service writes.
package logging

import (
	"fmt"
	"io"
	"log/slog"
)

// New returns a JSON logger writing to w at level ("debug", "info", "warn",
// "error"), with a "service" attribute on every record.
func New(w io.Writer, service, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})
	return slog.New(h).With("service", service), nil
}
