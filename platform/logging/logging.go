// Package logging builds the JSON slog logger every service writes.
package logging

import (
	"context"
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

// ListeningMsg is the msg of the record Listening writes.
const ListeningMsg = "listening"

// Listening writes one info record to w, whatever the program's LOG_LEVEL
// says, with the addresses its listeners are bound to ("http_addr",
// "admin_addr"): whatever started the program on port 0 (the tests'
// harness, platform/harness) reads them from here, and a platform run
// with LOG_LEVEL=warn must still say where it listens.
func Listening(ctx context.Context, w io.Writer, service, httpAddr, adminAddr string) {
	if w == nil {
		return
	}
	slog.New(slog.NewJSONHandler(w, nil)).With("service", service).InfoContext(ctx, ListeningMsg,
		slog.String("http_addr", httpAddr), slog.String("admin_addr", adminAddr))
}
