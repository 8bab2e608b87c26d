#!/usr/bin/env bash
# bench/eventlog_overhead.sh: queue throughput with the lifecycle event log off and on,
# in one run (issue target: the log at level lifecycle costs at most 15%).
#
#   bash bench/eventlog_overhead.sh                  # N=20000 REPS=3, level lifecycle
#   LEVEL=failures bash bench/eventlog_overhead.sh   # only the failure events
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$REPO/../shared/bench}
N=${N:-20000}
REPS=${REPS:-3}
OUT=/tmp/bench-results/eventlog-$(date -u +%Y%m%dT%H%M%SZ)
CGEN=/tmp/bench-cgen/amqp-cgen
mkdir -p "$OUT"
[ -x "$CGEN" ] || bash "$SHARED/setup.sh"

# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"  # amqpbroker_port

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

start() {  # start LABEL EVENTLOG(true|false) -> prints "pid port"
  local data="$OUT/$1-data"
  cat > "$OUT/$1.yaml" <<YAML
name: bench-$1
acceptors: [{name: amqp, url: "amqp://127.0.0.1:0"}]
http: {enabled: false}
persistence: {enabled: false}
event-log: {enabled: $2, level: ${LEVEL:-lifecycle}}
YAML
  "$REPO/.venv/bin/amqpbroker" run --config "$OUT/$1.yaml" --data-dir "$data" \
    --log-level warning > "$OUT/$1.log" 2>&1 &
  local pid=$! port
  port=$(amqpbroker_port "$data" "$pid" "$OUT/$1.log") || exit 1
  echo "$pid $port"
}

read -r OFF_PID OFF_PORT < <(start log-off false); PIDS+=("$OFF_PID")
read -r ON_PID ON_PORT < <(start log-on true); PIDS+=("$ON_PID")
[ -n "$OFF_PORT" ] && [ -n "$ON_PORT" ] || exit 1  # start() said why
BENCH=("$SHARED/amqp-bench" --client c --cgen "$CGEN" --size 1024 -n "$N" --quiet
       --flavor artemis --scenario queue --jsonl "$OUT/results.jsonl")
for rep in $(seq "$REPS"); do  # interleaved, so drift hits both alike
  "${BENCH[@]}" --reps 1 --url "amqp://127.0.0.1:$OFF_PORT" --label event-log-off \
    --broker-pid "$OFF_PID" > /dev/null
  "${BENCH[@]}" --reps 1 --url "amqp://127.0.0.1:$ON_PORT" --label event-log-on \
    --broker-pid "$ON_PID" > /dev/null
done
"$SHARED/amqp-bench" --report "$OUT/results.jsonl"
python3 - "$OUT/results.jsonl" "${LEVEL:-lifecycle}" <<'PY'
import json, statistics, sys
rates = {}
for line in open(sys.argv[1]):
    run = json.loads(line)
    if run.get("kind") == "run" and run.get("status") == "ok":
        rates.setdefault(run["label"], []).append(run["msgs_per_s"])
off, on = (statistics.median(rates[k]) for k in ("event-log-off", "event-log-on"))
# Runs alternate off, on: each pair ran a few seconds apart, so its ratio is the least
# touched by the machine's drift (a shared VM varies by +-20% from minute to minute).
pairs = [b / a for a, b in zip(rates["event-log-off"], rates["event-log-on"])]
level = sys.argv[2]
print(f"\nqueue msg/s: event log off {off:,.0f}, on ({level}) {on:,.0f}: "
      f"ratio of medians {on / off:.2f}; median of the {len(pairs)} paired ratios "
      f"{statistics.median(pairs):.2f} (runs: {', '.join(f'{r:.2f}' for r in pairs)}); "
      "target: ratio >= 0.85")
PY
echo "events written: $(cat "$OUT"/log-on-data/events/*.jsonl* 2>/dev/null | wc -l) lines"
