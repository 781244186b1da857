package testenv

import (
	"net"
	"testing"
)

// ClosedAddr returns a loopback address nothing listens on: dialing it is
// refused at once, as dialing a broker or database that is down is. Tests of
// outages point a client at it.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
