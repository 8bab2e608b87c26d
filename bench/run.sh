#!/usr/bin/env bash
# bench/run.sh: amqpbroker vs the Qpid Proton C example broker, in ONE run, same machine.
#
#   bash bench/run.sh                       # N=20000 REPS=1, scenarios queue,fanout
#   N=100000 REPS=3 bash bench/run.sh       # the longer, steadier figure
#   SCENARIOS=queue,redelivery bash bench/run.sh
#
# Builds the C load generator and the C broker with ../shared/bench/setup.sh if missing
# (needs libqpid-proton11-dev and -examples: `bash ../shared/bench/setup.sh --apt` once,
# as root). Brokers listen on loopback only and are stopped by PID on exit.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$REPO/../shared/bench}
N=${N:-20000}
REPS=${REPS:-1}
SCENARIOS=${SCENARIOS:-queue,fanout}
SIZE=${SIZE:-1024}
OUT=/tmp/bench-results/$(date -u +%Y%m%dT%H%M%SZ)
CGEN=/tmp/bench-cgen/amqp-cgen
CBROKER=/tmp/bench-peers/cbroker/broker-w1000
mkdir -p "$OUT"

if [ ! -x "$CGEN" ] || [ ! -x "$CBROKER" ]; then
  bash "$SHARED/setup.sh"
fi
[ -x "$REPO/.venv/bin/amqpbroker" ] || make -C "$REPO" .venv/.installed >/dev/null

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# The Qpid Proton C example broker, with its producer credit window raised to 1000.
CPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$(dirname "$CBROKER")" && exec "$CBROKER" 127.0.0.1 "$CPORT") > "$OUT/cbroker.log" 2>&1 &
CPID=$!; PIDS+=("$CPID")

# amqpbroker: memory only, no event log, port 0 -> ports.json.
DATA="$OUT/amqpbroker-data"
cat > "$OUT/amqpbroker.yaml" <<YAML
name: bench
acceptors: [{name: amqp, url: "amqp://127.0.0.1:0"}]
http: {bind: "127.0.0.1:0"}
persistence: {enabled: false}
event-log: {enabled: false}
YAML
"$REPO/.venv/bin/amqpbroker" run --config "$OUT/amqpbroker.yaml" --data-dir "$DATA" \
  --log-level warning > "$OUT/amqpbroker.log" 2>&1 &
APID=$!; PIDS+=("$APID")
for _ in $(seq 200); do [ -s "$DATA/ports.json" ] && break; sleep 0.1; done
APORT=$(python3 -c "import json; print(json.load(open('$DATA/ports.json'))['amqp'])")

BENCH=("$SHARED/amqp-bench" --client c --cgen "$CGEN" --size "$SIZE" -n "$N" --reps "$REPS" --quiet)
"${BENCH[@]}" --url "amqp://127.0.0.1:$CPORT" --label cbroker --flavor generic \
  --scenario "$(echo "$SCENARIOS" | tr ',' '\n' | grep -E '^(queue|durable)$' | paste -sd, -)" \
  --broker-pid "$CPID" --jsonl "$OUT/results.jsonl" > /dev/null
"${BENCH[@]}" --url "amqp://127.0.0.1:$APORT" --label amqpbroker --flavor artemis \
  --scenario "$SCENARIOS" --broker-pid "$APID" --jsonl "$OUT/results.jsonl" > /dev/null

"$SHARED/amqp-bench" --report "$OUT/results.jsonl"
python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rates = {}
for line in open(sys.argv[1]):
    run = json.loads(line)
    if run.get("kind") == "run" and run.get("status") == "ok":
        rates.setdefault((run["label"], run["scenario"]), []).append(run["msgs_per_s"])
print("\nscenario   amqpbroker msg/s   cbroker msg/s   ratio")
for scenario in sorted({s for _, s in rates}):
    ours = statistics.median(rates.get(("amqpbroker", scenario), [0]))
    ref = rates.get(("cbroker", scenario))
    ratio = f"{ours / statistics.median(ref):.2f}x" if ref else "(C broker: not supported)"
    print(f"{scenario:<10} {ours:>16,.0f} {statistics.median(ref) if ref else 0:>15,.0f}   {ratio}")
PY
echo "results: $OUT/results.jsonl"
