#!/usr/bin/env bash
# bench/callgrind.sh: instructions per message of the broker process (callgrind), the
# noise-free measure of issue 20; a loaded machine changes the time, not the count.
#
#   bash bench/callgrind.sh                      # queue, N=3000, shipped config
#   SCENARIO=durable N=3000 bash bench/callgrind.sh
#   EVENT_LOG=off bash bench/callgrind.sh        # the same with the event log off
#   PYTHON=.bench/.venv/bin/python bash bench/callgrind.sh   # the compiled build
#   STARTUP_WAIT=1800 bash bench/callgrind.sh   # seconds to wait for start-up (900)
#
# Starts the broker under valgrind's callgrind with config/broker.yaml (port 0), sends a
# 500-message queue warm-up, zeroes the counters, runs one amqp-bench SCENARIO of N 1 KiB
# messages with the C load generator, dumps the counters and prints their total over N:
# the broker's every thread (loop, journal writer), not the event log's writer process.
# Needs valgrind and the shared harness (../shared/bench, its setup.sh). ~1-3 min.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The shared harness beside the repo, or where SHARED_BENCH says (a git worktree elsewhere).
BENCH=${SHARED_BENCH:-$REPO/../shared/bench}/amqp-bench
CGEN=/tmp/bench-cgen/amqp-cgen
SCENARIO=${SCENARIO:-queue}
N=${N:-3000}
EVENT_LOG=${EVENT_LOG:-on}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
OUT=$(mktemp -d /tmp/amqpbroker-callgrind.XXXXXX)
for tool in valgrind callgrind_control callgrind_annotate; do
  command -v $tool > /dev/null || { echo "callgrind.sh: $tool missing (apt-get install valgrind)" >&2; exit 2; }
done
[ -x "$CGEN" ] && [ -x "$BENCH" ] || { echo "callgrind.sh: run bash $REPO/../shared/bench/setup.sh first" >&2; exit 2; }

sed -e 's#amqp://127.0.0.1:5672#amqp://127.0.0.1:0#' -e 's#127.0.0.1:8161#127.0.0.1:0#' \
  "$REPO/config/broker.yaml" > "$OUT/broker.yaml"
[ "$EVENT_LOG" = off ] && sed -i '/^event-log:/,/enabled/ s/enabled: true/enabled: false/' "$OUT/broker.yaml"
# From $OUT: PYTHON's own amqpbroker (the repo for an editable .venv; .bench/.venv's
# compiled one), or whatever PYTHONPATH puts first.
(cd "$OUT" && exec valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p" \
  --dump-line=no "$PYTHON" -m amqpbroker run --config broker.yaml --data-dir data \
  --log-level warning) > "$OUT/broker.log" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2> /dev/null || true; wait $PID 2> /dev/null || true' EXIT
# Start-up under valgrind: up to STARTUP_WAIT seconds (15 min: a loaded machine needs more
# than 5, issue 20).
for ((i = 0; i < ${STARTUP_WAIT:-900} * 2; i++)); do
  [ -s "$OUT/data/ports.json" ] && break
  kill -0 $PID 2> /dev/null || { tail -20 "$OUT/broker.log" >&2; exit 1; }
  sleep 0.5
done
PORT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["amqp"])' "$OUT/data/ports.json")
run() {  # SCENARIO N JSONL
  "$BENCH" --url "amqp://127.0.0.1:$PORT" --label amqpbroker --flavor artemis --client c \
    --cgen "$CGEN" --scenario "$1" -n "$2" --reps 1 --idle-timeout 120 --jsonl "$3" --quiet > /dev/null 2>&1 || true
}
run queue 500 "$OUT/warmup.jsonl"
callgrind_control -z $PID > /dev/null 2>&1
run "$SCENARIO" "$N" "$OUT/run.jsonl"
callgrind_control -d $PID > /dev/null 2>&1
kill -TERM $PID; wait $PID 2> /dev/null || true
trap - EXIT
grep -q '"status": "ok"' "$OUT/run.jsonl" || { echo "callgrind.sh: the run failed: $OUT/run.jsonl" >&2; exit 1; }
DUMP=$(ls -t "$OUT"/cg.*.[0-9]* | head -1)
TOTAL=$(callgrind_annotate "$DUMP" 2> /dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
echo "$SCENARIO N=$N event-log=$EVENT_LOG python=$PYTHON: $((TOTAL / N)) instructions per message ($OUT)"
