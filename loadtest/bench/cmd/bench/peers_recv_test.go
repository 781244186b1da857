package main

import (
	"encoding/binary"
	"slices"
	"testing"
)

// pgoutputStream is what pg_recvlogical writes for two transactions of a
// pgoutput stream: each message and a newline, with newlines inside the
// messages' fields too.
func pgoutputStream() []byte {
	var out []byte
	msg := func(parts ...[]byte) {
		for _, p := range parts {
			out = append(out, p...)
		}
		out = append(out, '\n')
	}
	u16 := func(v int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(v)) }
	u32 := func(v int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
	fixed := func(n int) []byte { // n bytes, every other one a newline
		b := make([]byte, n)
		for i := 0; i < n; i += 2 {
			b[i] = '\n'
		}
		return b
	}
	str := func(s string) []byte { return append([]byte(s), 0) }
	col := func(kind byte, v string) []byte {
		if kind == 'n' || kind == 'u' {
			return []byte{kind}
		}
		return append(append([]byte{kind}, u32(len(v))...), v...)
	}

	msg([]byte("B"), fixed(20))
	msg([]byte("R"), u32(16384), str("public"), str("outbox_events"), []byte("d"), u16(2),
		[]byte{1}, str("id"), fixed(8), []byte{0}, str("payload"), fixed(8))
	msg([]byte("I"), u32(16384), []byte("N"), u16(3), col('t', "a\nb\n"), col('n', ""), col('b', "\n\n"))
	msg([]byte("M"), []byte{1}, fixed(8), str("onceflow"), u32(3), []byte("x\ny"))
	msg([]byte("C"), fixed(25))
	msg([]byte("M"), []byte{0}, fixed(8), str("other"), u32(0)) // not transactional: outside any
	msg([]byte("B"), fixed(20))
	msg([]byte("I"), u32(16384), []byte("N"), u16(1), col('u', ""))
	msg([]byte("C"), fixed(25))
	return out
}

// The scanner finds each COMMIT and its transaction's changes (inserts,
// transactional messages) however pg_recvlogical's output is cut.
func TestPgoutputScanner(t *testing.T) {
	stream := pgoutputStream()
	want := []int{2, 1}
	for cut := range len(stream) + 1 {
		var s pgoutputScanner
		got, err := s.feed(stream[:cut])
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		more, err := s.feed(stream[cut:])
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if got = append(got, more...); !slices.Equal(got, want) || len(s.buf) != 0 {
			t.Fatalf("cut at %d: commits %v, %d bytes left; want %v, none", cut, got, len(s.buf), want)
		}
	}
	var s pgoutputScanner
	var got []int
	for i := range stream {
		c, err := s.feed(stream[i : i+1])
		if err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
		got = append(got, c...)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("byte by byte: commits %v, want %v", got, want)
	}
}

// What is not pg_recvlogical's output of pgoutput is an error, not a
// drain that never ends.
func TestPgoutputScannerRefuses(t *testing.T) {
	for name, out := range map[string][]byte{
		"test_decoding's text": []byte("BEGIN 745\ntable public.outbox_events: INSERT: id[bigint]:1\nCOMMIT 745\n"),
		"no newline":           append([]byte("B"), make([]byte, 21)...),
		"a column's kind":      append([]byte("I\x00\x00\x40\x00N\x00\x01x"), '\n'),
	} {
		var s pgoutputScanner
		if _, err := s.feed(out); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
