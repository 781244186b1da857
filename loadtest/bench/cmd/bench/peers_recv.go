package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
)

// The peers part's reference drain (issue 23: a relay's drain divided by
// pg_recvlogical's reading the same slot alone, the walsender's limit;
// today's goals are goals.go's): PostgreSQL's
// own pg_recvlogical streams a fresh slot while the same transactions as a
// relay's drains commit, and writes what it receives to a pipe the bench
// reads, so its figure is the walsender's decoding and sending and nothing
// else. It reads pgoutput with the options the platform's relay passes
// (pkg/outbox/cdc/stream.go: proto_version 1, the outbox's publication,
// messages true), which pg_recvlogical passes with -o, so the walsender
// decodes and sends exactly what it sends that relay.

// recvCommit is a transaction pg_recvlogical received whole: when the bench
// read its COMMIT message and how many changes (inserts and transactional
// logical messages) it carried; or err, when its output could not be read.
type recvCommit struct {
	at      time.Time
	changes int
	err     error
}

// recvDrains times pg_recvlogical's drains of two n-event transactions
// written in mode, on a fresh database and slot called name: cold, the
// first after a probe event (as a relay's, see waitFlowing), and warm, the
// next; each from its COMMIT to pg_recvlogical's output of its COMMIT
// message.
func (e peerEnv) recvDrains(ctx context.Context, name string, mode outbox.RelayMode, n int) (cold, warm float64, err error) {
	dbURL, dropDB, err := e.database(ctx, name)
	if err != nil {
		return 0, 0, err
	}
	defer dropDB()
	pool, err := openPool(ctx, dbURL)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	// Created here, it is consistent when the call returns: every
	// transaction committed after it is in its stream.
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name); err != nil {
		return 0, 0, fmt.Errorf("creating slot %s: %w", name, err)
	}
	// Recorded as a relay's slot: Emit (WAL-only mode) is satisfied by no
	// other (wal.SlotHeld).
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn)
		SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, name); err != nil {
		return 0, 0, fmt.Errorf("recording slot %s: %w", name, err)
	}
	recv, err := startRecv(ctx, e.recvBin, dbURL, name, filepath.Join(e.work, name+".stderr"))
	if err != nil {
		return 0, 0, err
	}
	defer recv.stop()

	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return cdc.Write(mode)(ctx, tx, peerEvent(-1)) }); err != nil {
		return 0, 0, err
	}
	if _, err := recv.next(ctx, 1, 2*time.Minute); err != nil {
		return 0, 0, fmt.Errorf("probe: %w", err)
	}
	drain := func() (float64, error) {
		committed, err := commitEvents(ctx, pool, mode, n)
		if err != nil {
			return 0, err
		}
		c, err := recv.next(ctx, n, drainLimit(n))
		if err != nil {
			return 0, err
		}
		return c.at.Sub(committed).Seconds(), nil
	}
	if cold, err = drain(); err != nil {
		return 0, 0, fmt.Errorf("cold drain: %w", err)
	}
	if warm, err = drain(); err != nil {
		return 0, 0, fmt.Errorf("warm drain: %w", err)
	}
	return cold, warm, nil
}

// recvProc is a running pg_recvlogical.
type recvProc struct {
	cancel  context.CancelFunc
	commits chan recvCommit
	exited  chan struct{} // closed when it exited; err then says why
	err     error
	stderr  string // its stderr's file
}

// startRecv starts pg_recvlogical streaming slot from the database at
// dbURL into the bench's pipe (stderr to the file at stderr).
func startRecv(ctx context.Context, bin, dbURL, slot, stderr string) (*recvProc, error) {
	if err := os.MkdirAll(filepath.Dir(stderr), 0o755); err != nil {
		return nil, err
	}
	errFile, err := os.Create(stderr)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &recvProc{cancel: cancel, commits: make(chan recvCommit, 16), exited: make(chan struct{}), stderr: stderr}
	// --fsync-interval 0: no fsync (a pipe has none anyway); --no-loop:
	// a lost connection ends it instead of retrying.
	cmd := exec.CommandContext(rctx, bin, "--start", "--slot", slot, "--dbname", dbURL, "--file", "-",
		"--no-loop", "--fsync-interval", "0",
		"--option", "proto_version=1", "--option", "publication_names="+cdc.Publication, "--option", "messages=true")
	// Stopped with SIGINT, it tells the server where it got to and exits
	// (Postgres 15's then logs "unexpected termination of replication
	// stream" to its stderr file: that is the stop, not a failure).
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Stdout = &recvOutput{commits: r.commits}
	cmd.Stderr = errFile
	if err := cmd.Start(); err != nil {
		cancel()
		errFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		r.err = cmd.Wait()
		errFile.Close()
		close(r.exited)
	}()
	return r, nil
}

// next waits up to limit for the next transaction pg_recvlogical receives
// and checks that it carried changes changes.
func (r *recvProc) next(ctx context.Context, changes int, limit time.Duration) (recvCommit, error) {
	select {
	case <-ctx.Done():
		return recvCommit{}, ctx.Err()
	case c := <-r.commits:
		if c.err != nil {
			return c, c.err
		}
		if c.changes != changes {
			return c, fmt.Errorf("pg_recvlogical received a transaction of %d changes, want %d", c.changes, changes)
		}
		return c, nil
	case <-r.exited:
		b, _ := os.ReadFile(r.stderr)
		return recvCommit{}, fmt.Errorf("pg_recvlogical exited (%v): %s", r.err, strings.TrimSpace(string(b)))
	case <-time.After(limit):
		return recvCommit{}, fmt.Errorf("pg_recvlogical received no transaction within %s", limit)
	}
}

// stop stops pg_recvlogical and waits until it exited, so that its slot is
// free to drop.
func (r *recvProc) stop() {
	r.cancel()
	<-r.exited
}

// recvOutput is pg_recvlogical's stdout: it hands each transaction to
// commits as soon as the bench read its COMMIT message. Only exec's copy
// from the pipe writes to it, one write at a time.
type recvOutput struct {
	scan    pgoutputScanner
	commits chan<- recvCommit
	err     error
}

func (o *recvOutput) Write(p []byte) (int, error) {
	at := time.Now()
	if o.err != nil {
		return 0, o.err
	}
	counts, err := o.scan.feed(p)
	found := make([]recvCommit, 0, len(counts)+1)
	for _, c := range counts {
		found = append(found, recvCommit{at: at, changes: c})
	}
	if err != nil {
		// Returned, it ends the copy: pg_recvlogical then exits on its
		// closed stdout.
		o.err = fmt.Errorf("reading pg_recvlogical's output: %w", err)
		found = append(found, recvCommit{err: o.err})
	}
	for _, c := range found {
		select {
		case o.commits <- c:
		default:
			// The buffer is full: the bench waits for one transaction at
			// a time, so nobody would read this one.
		}
	}
	if o.err != nil {
		return 0, o.err
	}
	return len(p), nil
}

// pgoutputScanner splits pg_recvlogical's output of a pgoutput stream
// (protocol version 1) into its messages, which pg_recvlogical writes each
// followed by a newline; a message may hold newlines itself, so each one's
// length is read from its fields (pgoutputLen).
type pgoutputScanner struct {
	buf     []byte
	changes int // of the transaction being received
}

// feed takes the next bytes of the output and returns the changes of each
// transaction whose COMMIT message they complete.
func (s *pgoutputScanner) feed(p []byte) ([]int, error) {
	s.buf = append(s.buf, p...)
	var commits []int
	off := 0
	defer func() { s.buf = append(s.buf[:0], s.buf[off:]...) }()
	for {
		n, ok, err := pgoutputLen(s.buf[off:])
		if err != nil {
			return commits, err
		}
		if !ok || off+n >= len(s.buf) { // the newline is still to come
			return commits, nil
		}
		if s.buf[off+n] != '\n' {
			return commits, fmt.Errorf("a pgoutput %q message not followed by a newline: not pg_recvlogical's output of pgoutput", s.buf[off])
		}
		switch s.buf[off] {
		case 'B':
			s.changes = 0
		case 'I':
			s.changes++
		case 'M':
			if s.buf[off+1]&1 == 1 { // transactional
				s.changes++
			}
		case 'C':
			commits = append(commits, s.changes)
		}
		off += n + 1
	}
}

// pgoutputLen is the length of the pgoutput message at the start of b
// (https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html),
// or false when b does not hold all of it yet. It knows the messages a
// publication of inserts sends with proto_version 1 and messages true.
func pgoutputLen(b []byte) (int, bool, error) {
	if len(b) == 0 {
		return 0, false, nil
	}
	r := msgReader{b: b, off: 1}
	switch b[0] {
	case 'B': // final LSN, commit time, xid
		r.skip(8 + 8 + 4)
	case 'C': // flags, commit LSN, end LSN, commit time
		r.skip(1 + 8 + 8 + 8)
	case 'O': // origin's LSN and name
		r.skip(8)
		r.cstring()
	case 'Y': // type: oid, namespace, name
		r.skip(4)
		r.cstring()
		r.cstring()
	case 'R': // relation: oid, namespace, name, replica identity, columns
		r.skip(4)
		r.cstring()
		r.cstring()
		r.skip(1)
		for range r.uint16() {
			r.skip(1) // flags
			r.cstring()
			r.skip(4 + 4) // type oid, modifier
		}
	case 'I': // insert: relation oid, 'N', the new tuple
		r.skip(4 + 1)
		r.tuple()
	case 'M': // logical message: flags, LSN, prefix, content
		r.skip(1 + 8)
		r.cstring()
		r.skip(int(r.uint32()))
	default:
		return 0, false, fmt.Errorf("pgoutput message type %q: neither an insert nor a logical message, nor what frames them", b[0])
	}
	if r.err != nil {
		return 0, false, r.err
	}
	if r.short {
		return 0, false, nil
	}
	return r.off, true, nil
}

// msgReader reads a pgoutput message's fields; short records that the
// message goes on past b.
type msgReader struct {
	b     []byte
	off   int
	short bool
	err   error
}

func (r *msgReader) skip(n int) {
	if r.short || r.off+n > len(r.b) {
		r.short = true
		return
	}
	r.off += n
}

func (r *msgReader) uint16() int {
	if r.skip(2); r.short {
		return 0
	}
	return int(binary.BigEndian.Uint16(r.b[r.off-2:]))
}

func (r *msgReader) uint32() uint32 {
	if r.skip(4); r.short {
		return 0
	}
	return binary.BigEndian.Uint32(r.b[r.off-4:])
}

func (r *msgReader) cstring() {
	if r.short {
		return
	}
	i := bytes.IndexByte(r.b[r.off:], 0)
	if i < 0 {
		r.short = true
		return
	}
	r.off += i + 1
}

// tuple reads TupleData: the column count, then each column's kind and,
// for text and binary ones, its length and bytes.
func (r *msgReader) tuple() {
	for range r.uint16() {
		if r.skip(1); r.short {
			return
		}
		switch kind := r.b[r.off-1]; kind {
		case 'n', 'u': // null, unchanged TOAST: no value
		case 't', 'b':
			r.skip(int(r.uint32()))
		default:
			r.err = fmt.Errorf("pgoutput tuple column of kind %q", kind)
			r.short = true
			return
		}
	}
}

// findRecvLogical finds pg_recvlogical: in pg_config --bindir, on PATH, or
// beside the dev stack's server (devstack/stack.sh runs the newest
// /usr/lib/postgresql/*/bin).
func findRecvLogical(ctx context.Context) (string, error) {
	var looked []string
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if bin := filepath.Join(dir, "pg_recvlogical"); isExecutable(bin) {
			return bin, nil
		}
		looked = append(looked, dir)
	} else {
		looked = append(looked, "pg_config --bindir (no pg_config)")
	}
	if bin, err := exec.LookPath("pg_recvlogical"); err == nil {
		return bin, nil
	}
	looked = append(looked, "PATH")
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first: 15 before 9.6.
	slices.SortFunc(dirs, func(a, b string) int { return majorOf(b) - majorOf(a) })
	for _, dir := range dirs {
		if bin := filepath.Join(dir, "pg_recvlogical"); isExecutable(bin) {
			return bin, nil
		}
	}
	looked = append(looked, "/usr/lib/postgresql/*/bin")
	return "", errors.New("pg_recvlogical not found (looked in " + strings.Join(looked, ", ") +
		"): install PostgreSQL's client programs (Debian: postgresql-client)")
}

// majorOf is the major version in /usr/lib/postgresql/<major>/bin.
func majorOf(dir string) int {
	n, _ := strconv.Atoi(strings.SplitN(filepath.Base(filepath.Dir(dir)), ".", 2)[0])
	return n
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
