package thirdparty

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/onceflow/onceflow/platform/apperr"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/tracing"
)

// ErrRejected is wrapped by errors for answers that retrying the same request
// cannot change (4xx other than 408 and 429). The shim dead-letters these
// instead of retrying; check with errors.Is(err, ErrRejected).
var ErrRejected = errors.New("rejected by the third-party reconciler")

// ErrUndecodable is wrapped by errors for a 2xx answer whose body the
// client could not decode: the reconciler answered, so it is up, but the
// answer is not what the API promises.
var ErrUndecodable = errors.New("undecodable answer from the third-party reconciler")

// StatusError is a non-2xx answer from the reconciler.
type StatusError struct {
	StatusCode int
	// Code and Message come from the JSON error body; Message falls back to
	// the start of the raw body when there is none.
	Code    string
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("third-party reconciler answered %d %s: %s",
		e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// Unwrap lets errors.Is(err, ErrRejected) hold for permanent failures.
func (e *StatusError) Unwrap() error {
	if e.StatusCode >= 400 && e.StatusCode < 500 &&
		e.StatusCode != http.StatusRequestTimeout && e.StatusCode != http.StatusTooManyRequests {
		return ErrRejected
	}
	return nil
}

// Client calls the third-party reconciler's API; it is the shim's side of
// the wire. Each request is a client span of the caller's trace and carries
// that trace in a traceparent header, so the reconciler's server span
// continues it. It is safe for concurrent use.
type Client struct {
	baseURL    string
	adminURL   string // the operator listener, for SetFaults (see WithAdmin)
	adminToken string
	hc         *http.Client
}

// WithAdmin returns a copy of c that also reaches the operator listener at
// adminURL (such as "http://127.0.0.1:9084") with the bearer token, which
// SetFaults needs.
func (c *Client) WithAdmin(adminURL, token string) *Client {
	cp := *c
	cp.adminURL, cp.adminToken = strings.TrimRight(adminURL, "/"), token
	return &cp
}

// NewClient returns a client for the reconciler at baseURL (such as
// "http://127.0.0.1:8084"). A nil httpClient gets one with a 10 s timeout,
// because http.DefaultClient has none and a hung third party would otherwise
// stall the shim's forwarder for ever.
func NewClient(baseURL string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 10 * time.Second}
	}
	traced := *httpClient // the caller's client stays as it was
	traced.Transport = tracing.Transport(httpClient.Transport)
	return &Client{baseURL: strings.TrimRight(baseURL, "/"), hc: &traced}
}

// Settle books req under key and returns the settlement as stored. The third
// party is not idempotent: calling Settle twice with one key books twice, so
// after a failure whose outcome is unknown (a timeout, a 5xx), call Lookup
// before calling Settle again.
func (c *Client) Settle(ctx context.Context, key string, req SettleRequest) (Settlement, error) {
	var s Settlement
	if err := c.do(ctx, http.MethodPost, "/settlements", key, req, &s); err != nil {
		return Settlement{}, fmt.Errorf("settling %s: %w", key, err)
	}
	return s, nil
}

// Lookup reports whether the reconciler has booked anything under key.
func (c *Client) Lookup(ctx context.Context, key string) (bool, error) {
	err := c.do(ctx, http.MethodGet, "/settlements/"+url.PathEscape(key), "", nil, nil)
	var se *StatusError
	switch {
	case err == nil:
		return true, nil
	// Only the API's own not_found means "never booked". A 404 from a wrong
	// base URL or a proxy must stay an error: read as "not booked", it would
	// make the shim send the settlement again.
	case errors.As(err, &se) && se.StatusCode == http.StatusNotFound && se.Code == string(apperr.NotFound):
		return false, nil
	default:
		return false, fmt.Errorf("looking up %s: %w", key, err)
	}
}

// SetFaults replaces the reconciler's fault-injection setting (POST
// /admin/faults on the operator listener; see WithAdmin), for tests and the
// fault-injection harness.
func (c *Client) SetFaults(ctx context.Context, f Faults) error {
	if c.adminURL == "" {
		return errors.New("setting faults: the client has no operator URL (see Client.WithAdmin)")
	}
	if err := c.do(ctx, http.MethodPost, c.adminURL+"/admin/faults", "", f, nil); err != nil {
		return fmt.Errorf("setting faults: %w", err)
	}
	return nil
}

// do sends one request and decodes a 2xx answer into out (if not nil); any
// other status becomes a *StatusError.
func (c *Client) do(ctx context.Context, method, path, key string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encoding request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	target, operator := c.baseURL+path, strings.HasPrefix(path, "http") // an operator call has the full URL
	if operator {
		target = path
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if operator && c.adminToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.adminToken)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(IdempotencyKeyHeader, key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() {
		// Drained so the connection goes back to the pool.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return readStatusError(resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%w: decoding %d answer: %w", ErrUndecodable, resp.StatusCode, err)
	}
	return nil
}

func readStatusError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	se := &StatusError{StatusCode: resp.StatusCode}
	var body httpserver.ErrorBody
	if err := json.Unmarshal(raw, &body); err == nil && body.Error.Message != "" {
		se.Code, se.Message = body.Error.Code, body.Error.Message
	} else {
		se.Message = strings.TrimSpace(string(raw))
		if se.Message == "" {
			se.Message = "(empty body)"
		}
	}
	return se
}
