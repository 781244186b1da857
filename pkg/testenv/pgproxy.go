package testenv

import (
	"net/url"
	"testing"
)

// ProxyDatabase puts a Proxy between a test and the database at dbURL and
// returns the URL that goes through it: Cut then takes the database away
// from whatever connects on that URL (a pool sees refused dials and broken
// connections, as in an outage) while the server stays up for every other
// test. The URL sets connect_timeout=1, so a dial into a cut proxy fails at
// once instead of after the default timeout.
func ProxyDatabase(t testing.TB, dbURL string) (string, *Proxy) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	p := NewProxy(t, u.Host)
	u.Host = p.Addr()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return u.String(), p
}
