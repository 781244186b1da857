#!/usr/bin/env bash
# The alert drill: the first sign of a stuck relay must be an alert. With the services running
# (`make demo` or `make services`) and a Prometheus scraping them (`make up-prometheus`), this
# restarts orders without its relay (RELAY_ENABLED=false) while an order arrives every 2 s, prints
# OutboxBacklogAgeOverSLO going inactive -> pending -> firing (backlog older than 60 s for 2 m,
# dashboards/alerts/onceflow.yml) and Prometheus's /api/v1/alerts, then restarts orders with its
# relay and prints the alert clearing. About 4 minutes. `make alert-drill` runs it.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PROM=http://127.0.0.1:${ONCEFLOW_PROM_PORT:-7090}
# The restarted orders keeps the operator token the others run with.
ADMIN_TOKEN=$(devstack/services.sh token)
export ADMIN_TOKEN
curl -sf "$PROM/-/ready" >/dev/null || { echo "alert-drill: no Prometheus on $PROM; run make up-prometheus first" >&2; exit 1; }
curl -sf localhost:8081/readyz >/dev/null || { echo "alert-drill: orders is not running on :8081; run make demo (or make services) first" >&2; exit 1; }
state() {
  curl -s "$PROM/api/v1/rules?type=alert" | python3 -c '
import json,sys
d=json.load(sys.stdin)
for g in d["data"]["groups"]:
  for r in g["rules"]:
    if r["name"]=="OutboxBacklogAgeOverSLO":
      print(r["state"], [(a["labels"].get("service"), a["state"], a.get("activeAt","")[:19]) for a in r.get("alerts",[])])'
}
age() { curl -s "$PROM/api/v1/query" --data-urlencode 'query=max by (service) (outbox_oldest_pending_age_seconds)' | python3 -c '
import json,sys
print({r["metric"].get("service","?"): round(float(r["value"][1]),1) for r in json.load(sys.stdin)["data"]["result"]})'; }
load() { while true; do curl -s -o /dev/null -X POST localhost:8081/orders -H 'Content-Type: application/json' -H "Idempotency-Key: drill-$RANDOM-$RANDOM" -d '{"customerId":"drill","amountCents":1234,"currency":"EUR"}'; sleep 2; done; }
echo "$(date +%T) before: $(state) age=$(age)"
kill "$(cat .devstack/run/orders.pid 2>/dev/null)" 2>/dev/null || { echo "alert-drill: orders was not started by make services/demo (.devstack/run/orders.pid)" >&2; exit 1; }
sleep 2
RELAY_ENABLED=false nohup "$PWD/.devstack/bin/orders" >> .devstack/logs/orders.log 2>&1 &
NORELAY=$!
for i in $(seq 1 30); do curl -sf localhost:8081/readyz >/dev/null && break; sleep 1; done
echo "$(date +%T) orders restarted with RELAY_ENABLED=false (pid $NORELAY)"
load & LOAD=$!
# Interrupted: stop the load, and give orders its relay back.
trap 'kill $LOAD 2>/dev/null; kill $NORELAY 2>/dev/null; sleep 1; nohup "$PWD/.devstack/bin/orders" >> .devstack/logs/orders.log 2>&1 & echo $! > .devstack/run/orders.pid; exit 130' INT TERM
prev=""
for i in $(seq 1 60); do
  s=$(state); a=$(age)
  if [[ "$s" != "$prev" ]]; then echo "$(date +%T) $s age=$a"; prev=$s; fi
  [[ $s == firing* ]] && break
  sleep 5
done
echo "$(date +%T) /api/v1/alerts:"; curl -s "$PROM/api/v1/alerts" | python3 -c '
import json,sys
for a in json.load(sys.stdin)["data"]["alerts"]:
  print(" ", a["labels"]["alertname"], a["labels"].get("service"), a["state"], a["activeAt"][:19], "|", a["annotations"].get("summary",""))'
trap - INT TERM
kill $NORELAY; sleep 2
nohup "$PWD/.devstack/bin/orders" >> .devstack/logs/orders.log 2>&1 &
echo $! > .devstack/run/orders.pid
echo "$(date +%T) orders restarted with its relay"
for i in $(seq 1 40); do
  s=$(state); a=$(age)
  if [[ "$s" != "$prev" ]]; then echo "$(date +%T) $s age=$a"; prev=$s; fi
  [[ $s == inactive* ]] && break
  sleep 5
done
kill $LOAD
echo "$(date +%T) after: $(state) age=$(age)"
