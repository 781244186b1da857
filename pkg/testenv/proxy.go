package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards a loopback port to a real server (Postgres, a Kafka broker)
// so a test can take the server away from the code under test without
// stopping it for everyone else: Cut refuses new connections and breaks the
// open ones, as a server that went away would; Heal listens again on the
// same address.
type Proxy struct {
	t      testing.TB
	target string

	mu    sync.Mutex
	addr  string
	ln    net.Listener
	conns []net.Conn
}

// NewProxy starts a proxy to target (host:port) that stops when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{t: t, target: target, addr: "127.0.0.1:0"}
	p.Heal()
	t.Cleanup(p.Cut)
	return p
}

// Addr is the proxy's host:port, the same across Cut and Heal.
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Heal accepts connections again (a no-op while the proxy is up).
func (p *Proxy) Heal() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy to %s: listening on %s: %v", p.target, p.addr, err)
	}
	p.ln, p.addr = ln, ln.Addr().String()
	go p.accept(ln)
}

func (p *Proxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln { // cut while dialing
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

// Cut closes the listener and every forwarded connection.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
