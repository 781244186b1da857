package testinfra

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one span a program exported, as an OTLP collector received it.
type Span struct {
	Service      string // the service.name of the exporting program
	Name         string
	Kind         tracepb.Span_SpanKind
	TraceID      string // hex, as in a traceparent
	SpanID       string
	ParentSpanID string            // "" for a root span
	Attributes   map[string]string // string and int values, as text
	Error        bool              // the span's status is Error
}

// OTLPReceiver is an OTLP/HTTP trace collector for tests: point a program's
// OTEL_EXPORTER_OTLP_ENDPOINT at URL and read what it exported with Spans.
type OTLPReceiver struct {
	// URL is the base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it.
	URL   string
	mu    sync.Mutex
	spans []Span
}

// NewOTLPReceiver starts a receiver that stops when the test ends. It
// accepts the protobuf encoding (OTLP/HTTP's default) on /v1/traces.
func NewOTLPReceiver(t testing.TB) *OTLPReceiver {
	t.Helper()
	r := &OTLPReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
			http.NotFound(w, req)
			return
		}
		body, err := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &msg)
		}
		if err != nil {
			t.Errorf("OTLP receiver: undecodable export: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&msg)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *OTLPReceiver) add(msg *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range msg.GetResourceSpans() {
		service := attributes(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{
					Service:      service,
					Name:         s.GetName(),
					Kind:         s.GetKind(),
					TraceID:      hex.EncodeToString(s.GetTraceId()),
					SpanID:       hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()),
					Attributes:   attributes(s.GetAttributes()),
					Error:        s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				})
			}
		}
	}
}

// Spans returns every span received so far.
func (r *OTLPReceiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// attributes flattens OTLP attributes to text, enough for assertions.
func attributes(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(v.BoolValue)
		default:
			m[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return m
}
