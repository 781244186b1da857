package httpserver

import (
	"net/http"
	"time"
)

// Timeouts are the limits every http.Server of the platform runs with, read
// from the environment by each service's Config. Without them a client that
// sends its body one byte a second, or never reads the answer, holds a
// connection (and a goroutine) as long as it likes.
type Timeouts struct {
	// ReadHeaderTimeout bounds reading the request line and headers.
	ReadHeaderTimeout time.Duration `env:"HTTP_READ_HEADER_TIMEOUT" envDefault:"5s"`
	// ReadTimeout bounds reading the whole request, body included.
	ReadTimeout time.Duration `env:"HTTP_READ_TIMEOUT" envDefault:"15s"`
	// WriteTimeout bounds the time from the end of the headers to the end of
	// the answer, and so how long a handler can take. It is longer than any
	// handler of the platform needs (an operator replay, a hung third-party
	// answer of at most thirdparty.MaxHangFor is cut short by it, which is
	// what a caller sees of a hang anyway).
	WriteTimeout time.Duration `env:"HTTP_WRITE_TIMEOUT" envDefault:"60s"`
	// IdleTimeout bounds how long a keep-alive connection waits for its next request.
	IdleTimeout time.Duration `env:"HTTP_IDLE_TIMEOUT" envDefault:"120s"`
	// MaxHeaderBytes bounds the request line and headers.
	MaxHeaderBytes int `env:"HTTP_MAX_HEADER_BYTES" envDefault:"65536"`
}

// DefaultTimeouts are the documented defaults, for programs without a Config.
var DefaultTimeouts = Timeouts{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       15 * time.Second,
	WriteTimeout:      60 * time.Second,
	IdleTimeout:       120 * time.Second,
	MaxHeaderBytes:    64 << 10,
}

// withDefaults fills the zero fields, so that a Timeouts{} literal is never
// a server without limits.
func (t Timeouts) withDefaults() Timeouts {
	d := DefaultTimeouts
	if t.ReadHeaderTimeout <= 0 {
		t.ReadHeaderTimeout = d.ReadHeaderTimeout
	}
	if t.ReadTimeout <= 0 {
		t.ReadTimeout = d.ReadTimeout
	}
	if t.WriteTimeout <= 0 {
		t.WriteTimeout = d.WriteTimeout
	}
	if t.IdleTimeout <= 0 {
		t.IdleTimeout = d.IdleTimeout
	}
	if t.MaxHeaderBytes <= 0 {
		t.MaxHeaderBytes = d.MaxHeaderBytes
	}
	return t
}

// Server returns an http.Server for h with these limits (zero fields take
// the defaults).
func (t Timeouts) Server(h http.Handler) *http.Server {
	t = t.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeaderTimeout,
		ReadTimeout:       t.ReadTimeout,
		WriteTimeout:      t.WriteTimeout,
		IdleTimeout:       t.IdleTimeout,
		MaxHeaderBytes:    t.MaxHeaderBytes,
	}
}
