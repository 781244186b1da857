#!/usr/bin/env bash
# Builds and runs the platform's four programs as background processes on
# loopback, against the dev stack that stack.sh starts. `make services`,
# `make stop` and `make demo` call this script.
#
# Usage: devstack/services.sh start | stop | status | token
#
#   start   build all four programs, (re)start them, return when each answers /readyz
#   stop    stop them (SIGTERM, then SIGKILL after 15 s)
#   status  one line per program
#   token   print the operator token (ADMIN_TOKEN) the programs run with
#
# Programs and their addresses, public (API, /healthz, /readyz) and operator
# (/metrics, /admin/... with the token); each reads more settings from the
# environment, and the defaults in each cmd/*/run.go Config match the dev stack:
#   reconciler  127.0.0.1:8084  127.0.0.1:9084  the third-party reconciler stand-in
#   shim        127.0.0.1:8083  127.0.0.1:9083  reconciler-shim: billing.events -> reconciler
#   billing     127.0.0.1:8082  127.0.0.1:9082  orders.events -> charges -> billing.events
#   orders      127.0.0.1:8081  127.0.0.1:9081  the orders API
#   reconcile   127.0.0.1:9085  (the same)      the reconciliation job: reconcile_* gauges on
#                                               /metrics (reads as reconcile_ro; `make reconcile`
#                                               prints the report)
#
# The operator token is $ADMIN_TOKEN when set, else a random one generated
# once into .devstack/admin-token (mode 600), which the demo and the alert
# drill read too: curl -H "Authorization: Bearer $(devstack/services.sh token)" \
#   127.0.0.1:9081/admin/outbox/dead
#
# Binaries in .devstack/bin, logs in .devstack/logs/<name>.log, pids in
# .devstack/run/<name>.pid, the reconciler's ledger in .devstack/reconciler/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.devstack"
BIN="$STATE/bin"
LOGS="$STATE/logs"
RUN="$STATE/run"

TOKEN_FILE="$STATE/admin-token"
# Where stack.sh records the Postgres hosts (the stack's, ONCEFLOW_STACK_DIR).
PG_HOSTS_FILE="${ONCEFLOW_STACK_DIR:-$STATE}/pg-hosts"

# name, package, address, operator address: started in this order, stopped in
# reverse, so each program's downstream is up before it.
PROGRAMS=(
  "reconciler ./services/reconciler-shim/cmd/reconciler 127.0.0.1:8084 127.0.0.1:9084"
  "shim ./services/reconciler-shim/cmd/shim 127.0.0.1:8083 127.0.0.1:9083"
  "billing ./services/billing/cmd/billing 127.0.0.1:8082 127.0.0.1:9082"
  "orders ./services/orders/cmd/orders 127.0.0.1:8081 127.0.0.1:9081"
  "reconcile ./tools/cmd/reconcile 127.0.0.1:9085 127.0.0.1:9085"
)

say() { printf '%s\n' "$*"; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

# admin_token prints $ADMIN_TOKEN, or the dev stack's own, made on first use.
admin_token() {
  if [[ -n ${ADMIN_TOKEN:-} ]]; then
    printf '%s\n' "$ADMIN_TOKEN"
    return
  fi
  if [[ ! -s $TOKEN_FILE ]]; then
    mkdir -p "$STATE"
    (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE")
  fi
  cat "$TOKEN_FILE"
}

pid_of() {
  local pidfile="$RUN/$1.pid" pid
  [[ -f $pidfile ]] || return 1
  pid=$(cat "$pidfile")
  # The pid must still be our program, not a reused number.
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && grep -qa "$BIN/$1" "/proc/$pid/cmdline" 2>/dev/null || return 1
  printf '%s\n' "$pid"
}

build() {
  mkdir -p "$BIN"
  say "services: building …"
  local entry name pkg
  for entry in "${PROGRAMS[@]}"; do
    read -r name pkg _ <<<"$entry"
    (cd "$ROOT" && go build -o "$BIN/$name" "$pkg") || die "building $name failed"
  done
}

stop_one() {
  local name=$1 pid
  pid=$(pid_of "$name") || { rm -f "$RUN/$name.pid"; return 0; }
  kill -TERM "$pid"
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "services: $name did not stop within 15 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/$name.pid"
  say "services: $name stopped (was pid $pid)"
}

# pg_url is role's URL of database db on the dev stack's Postgres: every
# host stack.sh recorded in pg-hosts (the primary and, with
# ONCEFLOW_PG_STANDBY=1, the standby), with target_session_attrs=read-write,
# so that a connection made after `make failover` finds the promoted standby
# without a restart. The dev stack trusts loopback, so the password is only
# the dev default that compose also uses.
pg_url() {
  local role=$1 db=$2 hosts="127.0.0.1:7432" attrs=""
  [[ -s $PG_HOSTS_FILE ]] && hosts=$(cat "$PG_HOSTS_FILE")
  [[ $hosts == *,* ]] && attrs="&target_session_attrs=read-write"
  printf 'postgres://%s:%s@%s/%s?sslmode=disable%s' "$role" "$role" "$hosts" "$db" "$attrs"
}

# db_url is the runtime role's URL of a program's database ("" for the
# reconciler, which has none).
db_url() {
  case $1 in
    orders|billing|shim) pg_url "$1_app" "$1" ;;
  esac
}

# migrate_url is the owner role's URL of a program's database ("" for the
# reconciler, which has none).
migrate_url() {
  case $1 in
    orders|billing|shim) pg_url "$1_owner" "$1" ;;
  esac
}

# repl_url is the replication role's URL of a producing service's database
# ("" for the others): the log-based relay's walsender connection under
# RELAY_MODE=cdc or wal, unused by the polling relay (tools/cmd/pgroles made
# the role: REPLICATION and CONNECT, nothing else). It lists the standby
# too: after a failover the relay's next connection finds the new primary.
repl_url() {
  case $1 in
    orders|billing) pg_url "$1_repl" "$1" ;;
  esac
}

# reconcile_env is the reconcile job's three read-only URLs, any host
# that answers: it only reads.
reconcile_env() {
  local db
  for db in orders billing shim; do
    printf 'ONCEFLOW_RECONCILE_%s_URL=%s\n' "${db^^}" "$(pg_url reconcile_ro "$db" | sed 's/&target_session_attrs=read-write//')"
  done
}

# relay_mode_of is a program's RELAY_MODE, the caller's: RELAY_MODE=debezium
# is orders' alone (Debezium publishes orders' outbox, docs/debezium; start it
# with `make up-debezium`), so billing then keeps its polling relay.
relay_mode_of() {
  local mode=${RELAY_MODE:-poll}
  [[ $1 == billing && $mode == debezium ]] && mode=poll
  printf '%s' "$mode"
}

# args_of is a program's command line: only the reconcile job takes flags.
args_of() {
  case $1 in
    reconcile) printf -- '-serve %s -interval 30s' "$2" ;;
  esac
}

wait_ready() {
  local name=$1 addr=$2 pid
  # 60 s: a first start migrates the schema, and a busy 2-core machine is slow.
  for _ in $(seq 1 600); do
    if curl -fsS -o /dev/null "http://$addr/readyz" 2>/dev/null; then
      say "services: $name ready on http://$addr"
      return 0
    fi
    # Alive, not pid_of: until the background shell has worked out the
    # program's environment and exec'd it, the pid's command line is the
    # shell's, not the program's (the reconcile job's three URLs take long
    # enough for a first check to land there).
    kill -0 "$(cat "$RUN/$name.pid" 2>/dev/null)" 2>/dev/null || break
    sleep 0.1
  done
  say "services: $name did not become ready; last lines of $LOGS/$name.log:"
  tail -n 30 "$LOGS/$name.log" >&2 || true
  curl -sS "http://$addr/readyz" >&2 2>/dev/null || true
  exit 1
}

cmd_start() {
  command -v curl >/dev/null || die "curl is needed to check readiness (apt-get install -y curl)"
  build
  mkdir -p "$LOGS" "$RUN" "$STATE/reconciler"
  local i entry name addr admin token
  token=$(admin_token)
  for (( i=${#PROGRAMS[@]}-1; i>=0; i-- )); do
    read -r name _ _ _ <<<"${PROGRAMS[$i]}"
    stop_one "$name"
  done
  for entry in "${PROGRAMS[@]}"; do
    read -r name _ addr admin <<<"$entry"
    [[ -f $LOGS/$name.log ]] && mv -f "$LOGS/$name.log" "$LOGS/$name.log.1"
    # The programs' defaults connect as each service's runtime role; the
    # schema owner migrates (devstack/stack.sh made both, tools/cmd/pgroles).
    local dburl; dburl=$(db_url "$name")
    # shellcheck disable=SC2046 # one NAME=value word per line
    env ${dburl:+DATABASE_URL="$dburl"} $([[ $name == reconcile ]] && reconcile_env) \
      HTTP_ADDR="$addr" ADMIN_ADDR="$admin" ADMIN_TOKEN="$token" LEDGER_PATH="$STATE/reconciler/ledger.jsonl" \
      MIGRATE_DATABASE_URL="$(migrate_url "$name")" \
      REPLICATION_DATABASE_URL="$(repl_url "$name")" RELAY_MODE="$(relay_mode_of "$name")" \
      setsid "$BIN/$name" $(args_of "$name" "$addr") >"$LOGS/$name.log" 2>&1 </dev/null &
    echo $! >"$RUN/$name.pid"
    wait_ready "$name" "$addr"
  done
}

cmd_stop() {
  local i name
  for (( i=${#PROGRAMS[@]}-1; i>=0; i-- )); do
    read -r name _ _ _ <<<"${PROGRAMS[$i]}"
    stop_one "$name"
  done
}

cmd_status() {
  local entry name addr admin pid
  for entry in "${PROGRAMS[@]}"; do
    read -r name _ addr admin <<<"$entry"
    if pid=$(pid_of "$name"); then
      printf '%-11s running  http://%-16s operator http://%-16s pid %-7s log %s\n' "$name" "$addr" "$admin" "$pid" "$LOGS/$name.log"
    else
      printf '%-11s stopped\n' "$name"
    fi
  done
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  token) admin_token ;;
  *) die "usage: $0 start | stop | status | token" ;;
esac
