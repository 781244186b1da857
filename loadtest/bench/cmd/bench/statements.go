package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Statements per order: how many SQL statements each program's database
// ran over a k6 run, divided by the orders placed, from pg_stat_statements
// (the dev stack preloads it; devstack/stack.sh). The counter is the
// cluster's, reset before each run; the programs each have a database of
// their own, so a database's calls are its program's (the orders database
// also gets the orders relay's, billing's the billing relay's). Top-level
// statements only (pg_stat_statements.track = top): a trigger's statements
// count with the statement that fired it. The bench's own reads come after
// the count.

// stmtStat is one statement's calls per order in one program's database.
type stmtStat struct {
	Program  string  `json:"program"`
	PerOrder float64 `json:"perOrder"`
	// ExecUsPerOrder is the statement's execution time per order, µs
	// (pg_stat_statements' total_exec_time: in the executor, not parsing
	// or the round trip).
	ExecUsPerOrder float64 `json:"execUsPerOrder"`
	Query          string  `json:"query"`
}

// resetStatements empties pg_stat_statements before a run, creating the
// extension in the admin database first; an error means the server does not
// preload the module (a stack from before it did: `make down && make up`).
func resetStatements(ctx context.Context, adminURL string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// readStatements returns each program's statements per order over the run
// (dbs: program → its database's URL), with "all" their sum, and the statements
// that ran at least once per ten orders or took 5 µs per order, most
// frequent first.
func readStatements(ctx context.Context, adminURL string, dbs map[string]string, orders float64) (map[string]float64, []stmtStat, error) {
	if orders <= 0 {
		return nil, nil, nil
	}
	program := map[string]string{}
	names := make([]string, 0, len(dbs))
	for prog, dbURL := range dbs {
		u, err := url.Parse(dbURL)
		if err != nil {
			return nil, nil, err
		}
		db := strings.TrimPrefix(u.Path, "/")
		program[db] = prog
		names = append(names, db)
	}
	per := map[string]float64{}
	var top []stmtStat
	err := query(ctx, adminURL, `SELECT d.datname, s.calls, s.total_exec_time, s.query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = ANY('{`+strings.Join(names, ",")+`}')`, func(r pgx.Rows) error {
		var (
			db, q  string
			calls  int64
			execMs float64
		)
		if err := r.Scan(&db, &calls, &execMs, &q); err != nil {
			return err
		}
		prog := program[db]
		v := float64(calls) / orders
		per[prog] += v
		per["all"] += v
		if v >= 0.1 || execMs*1000/orders >= 5 {
			top = append(top, stmtStat{Program: prog, PerOrder: v, ExecUsPerOrder: execMs * 1000 / orders, Query: oneLine(q, 100)})
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(top, func(i, j int) bool { return top[i].PerOrder > top[j].PerOrder })
	return per, top, nil
}

// oneLine is q on one line, cut to n runes.
func oneLine(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	if r := []rune(q); len(r) > n {
		q = string(r[:n]) + "…"
	}
	return q
}

// statementsTable renders runs' statements per order by program, and the
// first run's most frequent statements; empty when no run counted any.
func statementsTable(runs []Run) string {
	var b strings.Builder
	var first *Run
	for i, r := range runs {
		if len(r.StatementsPerOrder) == 0 || (r.Key != "ramp" && r.Key != "outbox") {
			continue // the steady run and the ramp; the others are in the JSON
		}
		if first == nil {
			b.WriteString("| run | orders | billing | shim | all |\n|---|---|---|---|---|\n")
			first = &runs[i]
		}
		s := r.StatementsPerOrder
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.label(), f1(s["orders"]), f1(s["billing"]), f1(s["shim"]), f1(s["all"]))
	}
	if first == nil || len(first.TopStatements) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "\nThe statements of %s that ran at least once per ten orders or took at least 5 µs per order, with their execution time per order:\n\n| program | per order | µs per order | statement |\n|---|---|---|---|\n", first.label())
	for i, s := range first.TopStatements {
		if i == 10 {
			fmt.Fprintf(&b, "| | | | (%d more in the JSON) |\n", len(first.TopStatements)-i)
			break
		}
		fmt.Fprintf(&b, "| %s | %s | %s | `%s` |\n", s.Program, f2(s.PerOrder), f0(s.ExecUsPerOrder), strings.ReplaceAll(s.Query, "|", `\|`))
	}
	return b.String()
}
