package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/onceflow/onceflow/tools/journey"
)

type tailOptions struct {
	n      int
	key    string
	since  time.Duration
	values bool
	json   bool
}

// tail prints a topic's last records with their headers. It reads each
// partition's leader directly, so it joins no consumer group and commits
// nothing: running it never disturbs the services' consumers.
func tail(ctx context.Context, brokers []string, topic string, o tailOptions, out io.Writer) error {
	if o.n < 1 {
		return fmt.Errorf("tail: -n must be at least 1, got %d", o.n)
	}
	cfg := journey.ScanConfig{Key: o.key}
	switch {
	case o.since > 0:
		cfg.Since = time.Now().Add(-o.since)
	case o.key == "":
		cfg.Last = o.n
	}
	recs, _, err := journey.Scan(ctx, brokers, topic, cfg)
	if err != nil {
		return fmt.Errorf("tail %s: %w", topic, err)
	}
	slices.SortStableFunc(recs, func(a, b journey.Record) int { return a.Time.Compare(b.Time) })
	if len(recs) > o.n {
		recs = recs[len(recs)-o.n:]
	}
	if o.json {
		enc := json.NewEncoder(out)
		for _, r := range recs {
			if err := enc.Encode(struct {
				journey.Record
				Value string `json:"value"`
			}{r, string(r.Value)}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(recs) == 0 {
		fmt.Fprintf(out, "%s: no records\n", topic)
		return nil
	}
	for _, r := range recs {
		fmt.Fprintf(out, "%s  partition %d  offset %d  key %s\n", r.Time.UTC().Format(time.RFC3339Nano), r.Partition, r.Offset, r.Key)
		keys := make([]string, 0, len(r.Headers))
		for k := range r.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(out, "  %s: %s\n", k, r.Headers[k])
		}
		v := string(r.Value)
		if !o.values && len(v) > 200 {
			v = v[:200]
			for !utf8.ValidString(v) {
				v = v[:len(v)-1]
			}
			v += fmt.Sprintf("… (%d bytes; -values prints all)", len(r.Value))
		}
		fmt.Fprintf(out, "  value: %s\n\n", strings.TrimSpace(v))
	}
	return nil
}
