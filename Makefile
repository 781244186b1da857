# Entry points for working on the platform. `make` alone lists them.
# Targets document themselves with a `## ` comment after their prerequisites.

.DEFAULT_GOAL := help

# Every module of go.work, as package patterns: one `go` command covers them all.
MODULES = $(shell go list -m -f '{{.Path}}/...')
# Arguments for the demo driver, e.g. `make demo DEMO_ARGS="-orders 1000 -cancel 0.2"`.
DEMO_ARGS ?=
# The proof `make prove` runs, e.g. `make prove P=chaos` (default: all of them; docs/proofs.md).
# RELAY_MODES: the relay modes atomicity, relay-crash and ordering run in (default poll,cdc,wal; also debezium: Kafka Connect as the relay).
# NEMESIS_TOPOLOGY=ha: the proofs' Kafka is a cluster of three brokers, and the nemesis adds its faults.
# ONCEFLOW_KAFKA_BROKERS_COUNT=3 make up: the dev stack's Kafka as a cluster of three (devstack/stack.sh).
P ?=

.PHONY: failover
.PHONY: help up down status logs services stop demo test vet fmt build prometheus-tools up-prometheus down-prometheus debezium-jars up-debezium down-debezium alert-drill dashboards reconcile contracts-check

help: ## List the targets
	@grep -E '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

up: ## Start PostgreSQL and Kafka on loopback (idempotent; see devstack/stack.sh)
	devstack/stack.sh up

# Postgres high availability (devstack/stack.sh): ONCEFLOW_PG_STANDBY=1 make up starts a streaming
# standby (ONCEFLOW_PG_SYNC=1: synchronous), ONCEFLOW_PG_VERSION=17 PostgreSQL 17 with failover slots.
failover: ## Fail Postgres over: stop the primary as a crash does, promote the standby (ONCEFLOW_PG_STANDBY=1 make up started it)
	devstack/stack.sh failover

down: stop ## Stop the services, then Kafka Connect, Prometheus, PostgreSQL and Kafka (data is kept in .devstack/)
	devstack/connect.sh down
	devstack/stack.sh prometheus down
	devstack/stack.sh down

status: ## Show what is running
	@devstack/stack.sh status
	@devstack/stack.sh prometheus status
	@devstack/connect.sh status
	@devstack/services.sh status

logs: ## Show the tail of the PostgreSQL and Kafka logs
	devstack/stack.sh logs

build: ## Build every module
	go build $(MODULES)

services: up ## Build and (re)start orders, billing, the shim and the reconciler stand-in
	devstack/services.sh start

stop: ## Stop the services (PostgreSQL and Kafka keep running)
	devstack/services.sh stop

reconcile: ## Print the reconciliation report of the dev stack: stuck, dead, uncertain and missing, with what to do (docs/reconciliation.md; ARGS=-o json)
	go run ./tools/cmd/reconcile $(ARGS)

contracts-check: ## Validate every record in Kafka (after make demo) against docs/asyncapi.yaml, each read by the CloudEvents SDK (docs/contracts.md)
	go run ./contracts/cmd/contractcheck $(ARGS)

demo: services ## Run the platform end to end: place orders, wait until all are settled, print a summary and one order's journey
	go run ./tools/cmd/demo -journey-file .devstack/demo-journey-order $(DEMO_ARGS)
	@echo
	@echo "One order's journey (onceflowctl journey <order-id>; -o json for all of it):"
	@go run ./tools/cmd/onceflowctl journey $$(cat .devstack/demo-journey-order)
	@echo
	@echo "The platform is still running: orders http://127.0.0.1:8081, billing :8082, shim :8083, reconciler :8084"
	@echo "(each has /readyz). Logs: .devstack/logs/. Stop the services with 'make stop', everything with 'make down'."
	@echo
	@echo "Where to look:"
	@echo "  metrics     http://127.0.0.1:9081/metrics  :9082/metrics  :9083/metrics  :9084/metrics  (the operator listeners)"
	@echo "  journey     go run ./tools/cmd/onceflowctl journey <order-id>   (any order: every hop, its latency, what is odd)"
	@echo "  records     go run ./tools/cmd/kafkactl tail orders.events       (with their headers)"
	@echo "  contracts   make contracts-check   (every record against docs/asyncapi.yaml, read by the CloudEvents SDK)"
	@echo "  operator    curl -H \"Authorization: Bearer \$$(devstack/services.sh token)\" http://127.0.0.1:9081/admin/outbox/dead"
	@if devstack/stack.sh prometheus status | grep -q running; then \
	  echo "  prometheus  http://127.0.0.1:$${ONCEFLOW_PROM_PORT:-7090}  (alerts: /alerts, rules from dashboards/alerts/)"; \
	else \
	  echo "  prometheus  not running: 'make up-prometheus' starts one scraping the services, with the alert rules"; \
	fi
	@echo "  grafana     under 'docker compose up' (secrets in .env, see .env.example): http://127.0.0.1:3000 (dashboards in the onceflow folder; Prometheus at http://127.0.0.1:9090)"

# The tests that need a Postgres standby (build tag standby: the relays' Standby.PublishReplicated, the
# consumers' CommitReplicated), one package at a time (-p 1: each freezes the one walsender, and one
# package's thaw would end another's freeze):
# a primary and a standby of their own (STANDBY_PG_PORT, its +1, below the kernel's ephemeral ports; data in .standby-stack, kept for the
# next run; `ONCEFLOW_STACK_DIR=.standby-stack devstack/stack.sh down postgres` stops them), Kafka
# from the dev stack. Not part of `make test`, whose stack has one server.
STANDBY_PG_PORT ?= 26532
.PHONY: test-standby
test-standby: up ## Run the tests that need a Postgres standby (outbox Standby.PublishReplicated, inbox CommitReplicated) on a primary+standby of their own
	ONCEFLOW_STACK_DIR=$(CURDIR)/.standby-stack ONCEFLOW_PG_PORT=$(STANDBY_PG_PORT) ONCEFLOW_PG_STANDBY=1 devstack/stack.sh up postgres
	ONCEFLOW_TEST_PG_URL='postgres://postgres:postgres@127.0.0.1:$(STANDBY_PG_PORT)/postgres?sslmode=disable' \
	  go test -tags standby -race -count=1 -p 1 -run Standby ./pkg/outbox/cdc/ ./pkg/inbox/

# -timeout: the quick proofs (loadtest/prove) run real crashes and restarts for several minutes.
# k6: the k6 smoke scenario (loadtest/bench/rig) runs the project's k6 build.
# debezium-jars: the quick Debezium test (loadtest/prove) runs Kafka Connect.
test: up prometheus-tools k6 debezium-jars ## Run every module's tests (with -race) against the real PostgreSQL and Kafka
	go test -race -count=1 -timeout 30m $(MODULES)

prometheus-tools: ## Install prometheus and promtool (Debian's package) when missing: the dashboard and alert tests run them
	devstack/stack.sh prometheus-install

up-prometheus: ## Start a Prometheus on 127.0.0.1:7090 scraping the services, with the alert rules (see devstack/stack.sh)
	devstack/stack.sh prometheus up

down-prometheus: ## Stop that Prometheus
	devstack/stack.sh prometheus down

debezium-jars: ## Fetch Kafka Connect and Debezium from Maven Central when missing (devstack/connect.sh fetch; the Debezium tests and proofs run them)
	devstack/connect.sh fetch

up-debezium: ## Start Kafka Connect with Debezium publishing orders' outbox (docs/debezium; run orders with RELAY_MODE=debezium)
	devstack/connect.sh up

down-debezium: ## Stop that Kafka Connect
	devstack/connect.sh down

alert-drill: ## With `make demo` and `make up-prometheus` running: stop the relay, watch the backlog alert fire and clear (~4 min)
	devstack/alert-drill.sh

dashboards: ## Regenerate the Grafana dashboards (dashboards/grafana/dashboards/*.json) from their Go code
	go generate ./dashboards/

vet: ## go vet and gofmt over every module
	go vet $(MODULES)
	@test -z "$$(gofmt -l .)" || { echo "not gofmt-formatted:"; gofmt -l .; exit 1; }

fmt: ## gofmt every Go file
	gofmt -w .

# The native Go fuzz targets, as package:Target. `go test` (and so `make test`)
# runs their seed corpora (f.Add and testdata/fuzz/); `make fuzz` fuzzes each
# for FUZZTIME, one after another (go test -fuzz takes one target at a time).
FUZZTIME ?= 30s
# How long the fuzzer may shrink an input. Go's default (60s) is spent on every
# new interesting input too, without counting the runs: with the bigger
# decoders the workers spent most of a 30s run shrinking inputs that fail
# nothing ("execs: N (0/sec)"). A crasher is still shrunk for this long.
FUZZMINIMIZETIME ?= 5s
FUZZ_TARGETS = \
	./pkg/event:FuzzFromKafka \
	./services/orders:FuzzDecodePlaceRequest \
	./platform/outboxhttp:FuzzDecodeRequeue \
	./platform/outboxhttp:FuzzDecodeReplay \
	./platform/inboxhttp:FuzzDecodeRequeue \
	./platform/strictjson:FuzzAgreesWithThreePass

.PHONY: fuzz
fuzz: ## Fuzz every decoder for FUZZTIME each (default 30s); a failure leaves its input in the package's testdata/fuzz/
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "== $$name ($$pkg, $(FUZZTIME))"; \
	  go test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$pkg; \
	done

.PHONY: prove
prove: ## Kill, restart and poison the real processes, audit every database and the ledger (P=<proof> for one; docs/proofs.md)
	go run ./loadtest/prove/cmd/prove -profile full $(if $(P),-only $(P)) $(if $(RELAY_MODES),-relay-modes $(RELAY_MODES)) \
	  $(if $(SEED),-seed $(SEED)) $(if $(NEMESIS),-nemesis $(NEMESIS)) $(if $(NEMESIS_TARGETS),-nemesis-targets $(NEMESIS_TARGETS)) $(if $(NEMESIS_DURATION),-nemesis-duration $(NEMESIS_DURATION)) \
	  $(if $(PG_REPLICATION),-pg-replication $(PG_REPLICATION)) $(if $(filter 1,$(PUBLISH_REPLICATED)),-publish-replicated) \
	  $(if $(NEMESIS_TOPOLOGY),-nemesis-topology $(NEMESIS_TOPOLOGY))

.PHONY: bench-outbox
bench-outbox: up ## Run the outbox benchmarks: ratios against same-run baselines (BENCHMARKS.md; BENCH=regex)
	devstack/bench-outbox.sh

.PHONY: bench-inbox
bench-inbox: up ## Run billing's consumption benchmarks: events/s, dup/clean ratio, knobs (BENCHMARKS.md; BENCH=regex)
	@mkdir -p .devstack/bench
	@bash -o pipefail -c '{ \
	  echo "# machine"; \
	  echo "date:     $$(date -u "+%Y-%m-%d %H:%M:%S UTC")"; \
	  echo "cpus:     $$(nproc) ($$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed "s/^ *//"))"; \
	  echo "memory:   $$(free -h | awk "/^Mem:/ {print \$$2}")"; \
	  echo "load:     $$(cut -d" " -f1-3 /proc/loadavg) (1/5/15 min; other work on the machine skews every number)"; \
	  echo "go:       $$(go version)"; \
	  echo "postgres: $$($$(ls -d /usr/lib/postgresql/*/bin/postgres | sort -V | tail -n 1) --version)"; \
	  echo "kafka:    $$(ls .devstack/kafka/libs/ | sed -nE "s/^kafka_2\.13-([0-9.]+)\.jar$$/\1/p" | head -n 1)"; \
	  echo; \
	  go test -run "^$$" -bench "$(or $(BENCH),.)" -benchtime 1x -timeout 20m ./services/billing/; \
	} 2>&1 | tee .devstack/bench/inbox-$$(date -u +%Y%m%dT%H%M%SZ).txt'

.PHONY: bench
# BASE=<rev> also runs every k6 scenario against that revision's programs,
# alternated with the working tree's, and prints each figure's ratio.
bench: up k6 ## Run every benchmark and k6 scenario in one go: BENCHMARKS.md's headline and detail, benchmarks/history/, benchmarks/*.json|svg (~20 min; BENCH_ARGS, BASE=rev for a same-run A/B)
	go run ./loadtest/bench/cmd/bench $(if $(BASE),-base $(BASE)) $(BENCH_ARGS)

# k6 built with xk6 and the project's extension (loadtest/xk6-onceflow), every
# version pinned: xk6 by loadtest/xk6/go.mod, k6 here, the extension's
# dependencies by its go.mod. Rebuilt only when the extension changes.
K6_VERSION = v1.8.1
K6_EXT = github.com/onceflow/onceflow/loadtest/xk6-onceflow
K6_EXT_SRC = $(wildcard loadtest/xk6-onceflow/*.go loadtest/xk6-onceflow/go.*) $(wildcard pkg/event/*.go pkg/go.*)

.PHONY: k6
k6: bin/k6 ## Build k6 with the project's extension k6/x/onceflow into bin/k6 (xk6; skipped when up to date)

bin/xk6: loadtest/xk6/go.mod loadtest/xk6/go.sum
	cd loadtest/xk6 && GOWORK=off go build -o $(CURDIR)/bin/xk6 go.k6.io/xk6/cmd/xk6

bin/k6: bin/xk6 $(K6_EXT_SRC)
	GOWORK=off bin/xk6 build $(K6_VERSION) --output $(CURDIR)/bin/k6.tmp \
	  --with $(K6_EXT)=$(CURDIR)/loadtest/xk6-onceflow \
	  --replace github.com/onceflow/onceflow/pkg=$(CURDIR)/pkg
	mv -f bin/k6.tmp bin/k6
