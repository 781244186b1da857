#!/usr/bin/env bash
# Runs the pkg/outbox and pkg/outbox/cdc benchmarks against the dev stack (`make bench-outbox`
# starts it first) and prints the machine facts beside the results, since the
# numbers mean little without them. BENCHMARKS.md explains every number.
#
# Usage: devstack/bench-outbox.sh
#
# Settings (environment, with defaults):
#   BENCH        .    which benchmarks (go test -bench), e.g. 'RelayDrain/batch=1000$'
#   BENCH_COUNT  1    how many times to run each (go test -count)
#   BENCH_FSYNC  0    1: also measure the disk's fsync rate with pg_test_fsync (adds ~40 s)
#   BENCH_ARGS        more go test flags, e.g. '-cpuprofile cpu.prof' (the test binary
#                     is then left in the current directory for `go tool pprof`)
#
# The output is also kept in .devstack/bench/outbox-<time>.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$ROOT/.devstack/bench"
OUT="$OUT_DIR/outbox-$(date -u +%Y%m%dT%H%M%SZ).txt"
mkdir -p "$OUT_DIR"

pg_bin() {
  local d found=""
  for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V); do
    [[ -x $d/postgres ]] && found=$d
  done
  printf '%s' "$found"
}

facts() {
  local pg jar
  pg=$(pg_bin)
  echo "# machine"
  echo "date:     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "cpus:     $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
  echo "memory:   $(free -h | awk '/^Mem:/ {print $2}')"
  echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min; other work on the machine skews every number)"
  echo "go:       $(go version)"
  echo "postgres: $([[ -n $pg ]] && "$pg/postgres" --version)"
  for jar in "$ROOT"/.devstack/kafka/libs/kafka_2.13-*.jar; do
    [[ -f $jar ]] && echo "kafka:    $(basename "$jar" .jar | sed 's/^kafka_2\.13-//')"
  done
  if [[ ${BENCH_FSYNC:-0} == 1 && -n $pg ]]; then
    local f="$OUT_DIR/pg_test_fsync.tmp"
    echo "fsync (pg_test_fsync -s 2 on $(df --output=source "$OUT_DIR" | tail -n 1), one 8 kB write; Postgres uses fdatasync):"
    "$pg/pg_test_fsync" -s 2 -f "$f" | grep -m 4 'ops/sec' | sed 's/^ */  /'
    rm -f "$f"
  fi
  echo
}

cd "$ROOT"
{
  facts
  # -benchtime 1x: each benchmark is one whole experiment that reports its own
  # rates and ratios; -run '^$' skips the tests.
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
  go test -run '^$' -bench "${BENCH:-.}" -benchtime 1x -count "${BENCH_COUNT:-1}" -timeout 20m \
    ${BENCH_ARGS:-} ./pkg/outbox/ ./pkg/outbox/cdc/
} 2>&1 | tee "$OUT"
echo "(kept in ${OUT#"$ROOT"/})"
