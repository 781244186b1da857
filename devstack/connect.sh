#!/usr/bin/env bash
# Kafka Connect with Debezium's PostgreSQL connector on loopback, without Docker:
# the Debezium relay of docs/debezium, registered from the file the docs ship,
# as it is.
#
# Usage: devstack/connect.sh up | down | kill | status | logs [lines] | reset | fetch | check
#
#   up      fetch the jars (first run), start a standalone Connect worker and
#           the connector of $ONCEFLOW_CONNECT_CONNECTOR; return once its task
#           runs (idempotent: when the worker runs it only re-checks it).
#   down    stop the worker (SIGTERM: it commits its offsets and stops).
#   kill    SIGKILL the worker: a relay crash mid-stream (offsets since the
#           last flush are lost; Debezium republishes from the slot).
#   status  one line: the worker, the connector and its task.
#   logs    the tail of the worker's log (default 40 lines).
#   reset   with the worker stopped, drop the connector's replication slot and
#           its offsets, so the next `up` starts from now.
#   fetch   only fetch the jars (what `up` does on its first run).
#   check   exit 1, saying what to do, unless java and the jars are here
#           (the Go tests that start Connect run it first).
#
# Settings (environment, with defaults):
#   ONCEFLOW_CONNECT_DIR        $ROOT/.devstack/connect  its config, offsets, log and pid
#                               (a proofs stack passes one of its own)
#   ONCEFLOW_CONNECT_PORT       58083  the worker's REST port on 127.0.0.1
#   ONCEFLOW_CONNECT_HEAP       384m   max heap (-Xmx); at most 512m: the machine has 2 cores
#   ONCEFLOW_CONNECT_BROKERS    127.0.0.1:7092  the Kafka it publishes to
#   ONCEFLOW_CONNECT_CONNECTOR  docs/debezium/orders-outbox-connector.json
#   ONCEFLOW_CONNECT_TIMEOUT    90     seconds the task gets to start running
#   ONCEFLOW_DEBEZIUM_DB_HOST      127.0.0.1               \
#   ONCEFLOW_DEBEZIUM_DB_PORT      7432                    | what the file's ${env:…}
#   ONCEFLOW_DEBEZIUM_DB_USER      orders_repl              | placeholders read (Connect's
#   ONCEFLOW_DEBEZIUM_DB_PASSWORD  orders_repl              | EnvVarConfigProvider): the dev
#   ONCEFLOW_DEBEZIUM_DB_NAME      orders                   | stack's orders database, its
#   ONCEFLOW_DEBEZIUM_SLOT         debezium_orders_outbox   | replication role, the slot and
#   ONCEFLOW_DEBEZIUM_TOPIC        orders.events           /  the topic (docs/debezium)
#
# The jars (Kafka Connect 3.9.1, the broker's version, and Debezium 3.1.3.Final,
# as devstack/connect-pom.xml lists them) are a download cache in
# $ROOT/.devstack/connect/{libs,plugins}, shared by every Connect of this checkout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.devstack/connect"
[[ -L $ROOT/.devstack ]] && CACHE="$(readlink -f "$ROOT/.devstack")/connect"
DIR="${ONCEFLOW_CONNECT_DIR:-$CACHE}"
PORT="${ONCEFLOW_CONNECT_PORT:-58083}"
HEAP="${ONCEFLOW_CONNECT_HEAP:-384m}"
BROKERS="${ONCEFLOW_CONNECT_BROKERS:-127.0.0.1:7092}"
CONNECTOR="${ONCEFLOW_CONNECT_CONNECTOR:-$ROOT/docs/debezium/orders-outbox-connector.json}"
TIMEOUT="${ONCEFLOW_CONNECT_TIMEOUT:-90}"
export ONCEFLOW_DEBEZIUM_DB_HOST="${ONCEFLOW_DEBEZIUM_DB_HOST:-127.0.0.1}"
export ONCEFLOW_DEBEZIUM_DB_PORT="${ONCEFLOW_DEBEZIUM_DB_PORT:-7432}"
export ONCEFLOW_DEBEZIUM_DB_USER="${ONCEFLOW_DEBEZIUM_DB_USER:-orders_repl}"
export ONCEFLOW_DEBEZIUM_DB_PASSWORD="${ONCEFLOW_DEBEZIUM_DB_PASSWORD:-orders_repl}"
export ONCEFLOW_DEBEZIUM_DB_NAME="${ONCEFLOW_DEBEZIUM_DB_NAME:-orders}"
export ONCEFLOW_DEBEZIUM_SLOT="${ONCEFLOW_DEBEZIUM_SLOT:-debezium_orders_outbox}"
export ONCEFLOW_DEBEZIUM_TOPIC="${ONCEFLOW_DEBEZIUM_TOPIC:-orders.events}"

LIBS="$CACHE/libs"
PLUGINS="$CACHE/plugins"
POM="$ROOT/devstack/connect-pom.xml"
PROPS="$DIR/worker.properties"
LOG4J="$DIR/log4j.properties"
OFFSETS="$DIR/offsets.dat"
LOG="$DIR/connect.log"
PID="$DIR/connect.pid"

say() { printf '%s\n' "$*"; }
die() { printf 'connect.sh: %s\n' "$*" >&2; exit 1; }

# The connector's name, from the file itself.
connector_name() { sed -n 's/^ *"name": *"\([^"]*\)".*/\1/p' "$CONNECTOR" | head -n 1; }
# connector_setting prints a setting of the file as Connect resolves it: a
# ${env:NAME} placeholder becomes the value of NAME here.
connector_setting() {
  local v
  v=$(sed -n "s/^ *\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" "$CONNECTOR" | head -n 1)
  if [[ $v =~ ^\$\{env:([A-Za-z0-9_]+)\}$ ]]; then v=${!BASH_REMATCH[1]:-}; fi
  printf '%s\n' "$v"
}

validate() {
  [[ $PORT =~ ^[0-9]+$ && $TIMEOUT =~ ^[0-9]+$ ]] || die "ONCEFLOW_CONNECT_PORT and _TIMEOUT must be numbers"
  local mb
  case "$HEAP" in
    *[mM]) mb=${HEAP%[mM]} ;;
    *) die "ONCEFLOW_CONNECT_HEAP must look like 384m, got '$HEAP'" ;;
  esac
  [[ $mb =~ ^[0-9]+$ ]] && (( mb >= 128 && mb <= 512 )) || die "ONCEFLOW_CONNECT_HEAP must be between 128m and 512m, got '$HEAP'"
  [[ -f $CONNECTOR ]] || die "no connector file at $CONNECTOR"
  [[ -n $(connector_name) ]] || die "$CONNECTOR has no \"name\""
}

# fetch copies Connect and the connector from Maven Central (the same
# marker scheme as stack.sh's Kafka jars: a pom change refetches, an
# interrupted download is redone).
fetch() {
  local marker="$CACHE/.complete" want
  want=$(sha256sum "$POM" | cut -d' ' -f1)
  [[ -f $marker && $(cat "$marker") == "$want" ]] && return
  command -v mvn >/dev/null && command -v java >/dev/null || die "needs java and mvn (devstack/stack.sh up installs them)"
  say "connect: fetching Kafka Connect and Debezium jars (first run only) …"
  mkdir -p "$CACHE"
  rm -rf "$LIBS" "$PLUGINS" "$CACHE/tmp"
  mvn -q -B -f "$POM" -P runtime dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$CACHE/tmp/libs" >"$CACHE/mvn.log" 2>&1 \
    && mvn -q -B -f "$POM" -P debezium dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$CACHE/tmp/plugins/debezium-postgres" >>"$CACHE/mvn.log" 2>&1 \
    || { tail -n 40 "$CACHE/mvn.log" >&2; die "fetching the Connect jars with mvn failed"; }
  ls "$CACHE/tmp/libs"/connect-runtime-*.jar "$CACHE/tmp/plugins/debezium-postgres"/debezium-connector-postgres-*.jar \
    >/dev/null || die "mvn finished but connect-runtime or the Debezium connector is missing"
  mv "$CACHE/tmp/libs" "$LIBS"
  mv "$CACHE/tmp/plugins" "$PLUGINS"
  rmdir "$CACHE/tmp"
  printf '%s\n' "$want" >"$marker"
}

check() {
  command -v java >/dev/null || die "needs java 17 or later on PATH (devstack/stack.sh up installs it on Debian)"
  local marker="$CACHE/.complete"
  [[ -f $marker && $(cat "$marker") == "$(sha256sum "$POM" | cut -d' ' -f1)" ]] \
    || die "the Kafka Connect and Debezium jars are not in $CACHE: run 'devstack/connect.sh fetch' (or 'make debezium-jars'; needs mvn, which 'make up' installs)"
  say "connect: java and the jars are here ($CACHE)"
}

configure() {
  mkdir -p "$DIR"
  cat >"$PROPS" <<EOF
# Written by devstack/connect.sh on every \`up\`.
bootstrap.servers=$BROKERS
listeners=http://127.0.0.1:$PORT
rest.advertised.host.name=127.0.0.1
plugin.path=$PLUGINS
# The connector file sets its own converters; these are the worker's defaults.
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
# Standalone mode keeps source offsets (Debezium's LSNs) in a file. Flushed
# every second instead of every minute: after a crash Debezium republishes
# from the last flushed LSN, and the inbox absorbs the duplicates.
offset.storage.file.filename=$OFFSETS
offset.flush.interval.ms=1000
# The source task's producer, tuned for latency as Debezium's docs advise
# (the connector file sets the poll interval and the batch and queue sizes):
# a few ms of linger instead of Connect's default, and the idempotent
# producer, so a retried batch is not written twice.
producer.linger.ms=5
producer.enable.idempotence=true
# The connector file's \${env:ONCEFLOW_DEBEZIUM_DB_*} placeholders: hosts,
# ports and credentials come from this script's environment, so the shipped
# file is registered as it is.
config.providers=env
config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider
config.providers.env.param.allowlist.pattern=^ONCEFLOW_DEBEZIUM_.*
EOF
  cat >"$LOG4J" <<'EOF'
# Written by devstack/connect.sh on every `up`.
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.clients=WARN
log4j.logger.org.reflections=ERROR
EOF
}

pid() { [[ -f $PID ]] && cat "$PID" || true; }
# alive: the pid file's process exists (right after the start it may not
# have exec'd java yet, so its command line is still this script's).
alive() {
  local p; p=$(pid)
  [[ -n $p ]] && kill -0 "$p" 2>/dev/null
}
# running: it is a Connect worker (a stale pid file may name anything).
running() { alive && grep -q ConnectStandalone "/proc/$(pid)/cmdline" 2>/dev/null; }

# task_state prints the connector's first task state (RUNNING, FAILED, …) or nothing.
task_state() {
  curl -sf "http://127.0.0.1:$PORT/connectors/$(connector_name)/status" 2>/dev/null \
    | sed -n 's/.*"tasks":\[{[^]]*"state":"\([A-Z]*\)".*/\1/p' || true
}

show_log() {
  printf '\n--- last 40 lines of %s ---\n' "$LOG" >&2
  tail -n 40 "$LOG" >&2 || true
  local errors
  errors=$(grep -E 'ERROR|Caused by|Exception:' "$LOG" | head -n 8 | cut -c1-400 || true)
  [[ -z $errors ]] || printf -- '--- first errors ---\n%s\n' "$errors" >&2
}

up() {
  validate
  fetch
  if ! running; then
    configure
    say "connect: starting a standalone worker on 127.0.0.1:$PORT with $(basename "$CONNECTOR") …"
    [[ -f $LOG ]] && mv -f "$LOG" "$LOG.1" # the last lifetime's, e.g. one that was killed
    # setsid: the worker outlives this script and is stopped by pid.
    KAFKA_HEAP_OPTS="" setsid java -Xms64m -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -Dlog4j.configuration="file:$LOG4J" \
      -cp "$LIBS/*" org.apache.kafka.connect.cli.ConnectStandalone "$PROPS" "$CONNECTOR" \
      >"$LOG" 2>&1 </dev/null &
    echo $! >"$PID"
  fi
  local deadline=$((SECONDS + TIMEOUT)) state=""
  while (( SECONDS < deadline )); do
    alive || { show_log; die "the Connect worker exited"; }
    state=$(task_state)
    case "$state" in
      RUNNING) say "connect: $(connector_name) running (pid $(pid), REST http://127.0.0.1:$PORT)"; return ;;
      FAILED) show_log; curl -s "http://127.0.0.1:$PORT/connectors/$(connector_name)/status" >&2 || true; echo >&2
              die "the connector's task failed" ;;
    esac
    sleep 1
  done
  show_log
  die "the connector's task did not run within ${TIMEOUT}s (state '${state:-none}')"
}

down() {
  running || { say "connect: not running"; rm -f "$PID"; return; }
  local p; p=$(pid)
  kill -TERM "$p"
  local deadline=$((SECONDS + 30))
  while kill -0 "$p" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.5; done
  if kill -0 "$p" 2>/dev/null; then kill -KILL "$p"; say "connect: killed (pid $p, did not stop in 30s)"
  else say "connect: stopped (was pid $p)"; fi
  rm -f "$PID"
}

kill9() {
  running || die "not running"
  local p; p=$(pid)
  kill -KILL "$p"
  while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  rm -f "$PID"
  say "connect: SIGKILLed (was pid $p)"
}

status() {
  if running; then
    local state; state=$(task_state)
    say "connect: running (pid $(pid)), $(connector_name) task ${state:-unknown}"
  else
    say "connect: not running"
  fi
}

reset() {
  running && die "stop the worker first (connect.sh down)"
  local slot; slot=$(connector_setting slot.name)
  PGPASSWORD="${PGPASSWORD:-postgres}" psql -h "$ONCEFLOW_DEBEZIUM_DB_HOST" -p "$ONCEFLOW_DEBEZIUM_DB_PORT" -U postgres \
    -d "$(connector_setting database.dbname)" -v ON_ERROR_STOP=1 -Atqc \
    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$slot'" >/dev/null
  rm -f "$OFFSETS"
  say "connect: dropped slot $slot and the offsets"
}

main() {
  local cmd=${1:-}; shift || true
  case "$cmd" in
    up) up ;;
    down) down ;;
    kill) kill9 ;;
    status) status ;;
    logs) tail -n "${1:-40}" "$LOG" ;;
    reset) reset ;;
    fetch) fetch; say "connect: jars in $CACHE" ;;
    check) check ;;
    *) sed -n '2,21s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
}

main "$@"
