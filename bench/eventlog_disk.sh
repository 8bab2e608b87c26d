#!/usr/bin/env bash
# bench/eventlog_disk.sh: bytes the lifecycle event log puts on disk per message, plain and
# gzipped (issue 17), with the shipped config/broker.yaml (moved to free ports).
#
#   bash bench/eventlog_disk.sh                 # N=100000 1 KiB messages, queue scenario
#   N=20000 CLIENT=c bash bench/eventlog_disk.sh
#
# Runs the amqp-bench queue scenario against two brokers in turn: event-log.compress
# false, then true (the default). Prints the events directory's bytes per message for
# both, the gzip ratio, throughput, and how long gzip takes per rotated file at levels 1
# and 6 on the plain files.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$REPO/../shared/bench}
N=${N:-100000}
CLIENT=${CLIENT:-python}
PY=${PY:-$REPO/.venv/bin/python}
OUT=${OUT:-/tmp/bench-results/eventlog-disk-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"  # amqpbroker_port
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}  # this checkout, not an installed copy

PID=
cleanup() { [ -z "$PID" ] || { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }; }
trap cleanup EXIT

run() {  # run LABEL COMPRESS: one broker, one queue run, stop; events stay in $OUT/LABEL-data
  local data="$OUT/$1-data" port
  sed -e 's#amqp://127.0.0.1:5672#amqp://127.0.0.1:0#' -e 's#127.0.0.1:8161#127.0.0.1:0#' \
      -e "s#^  level: lifecycle.*#  level: lifecycle\n  compress: $2#" \
      "$REPO/config/broker.yaml" > "$OUT/$1.yaml"
  "$PY" -m amqpbroker run --config "$OUT/$1.yaml" --data-dir "$data" --log-level warning \
      > "$OUT/$1.log" 2>&1 &
  PID=$!
  port=$(amqpbroker_port "$data" "$PID" "$OUT/$1.log") || exit 1
  "$SHARED/amqp-bench" --client "$CLIENT" --worker-python "$PY" --size 1024 -n "$N" --quiet \
      --flavor artemis --scenario queue --reps 1 --url "amqp://127.0.0.1:$port" \
      --label "$1" --broker-pid "$PID" --jsonl "$OUT/results.jsonl" > /dev/null
  kill -TERM "$PID"; wait "$PID" || true; PID=
}

run plain false
run gzip true
"$SHARED/amqp-bench" --report "$OUT/results.jsonl"
"$PY" - "$OUT" "$N" <<'PY'
import gzip, json, sys, time
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
def size(label): return sum(p.stat().st_size for p in (out / f"{label}-data" / "events").glob("events-*"))
def lines(label):
    total = 0
    for p in (out / f"{label}-data" / "events").glob("events-*"):
        data = p.read_bytes()
        total += (gzip.decompress(data) if p.suffix == ".gz" else data).count(b"\n")
    return total
plain, packed = size("plain"), size("gzip")
print(f"plain: {plain:,} bytes, {lines('plain'):,} lines, {plain / n:,.0f} bytes/message")
print(f"gzip:  {packed:,} bytes, {lines('gzip'):,} lines, {packed / n:,.0f} bytes/message")
print(f"ratio (plain/gzip bytes per message): {plain / packed:.1f}x")
for level in (1, 6):
    raw = zipped = 0; seconds = 0.0
    for p in sorted((out / "plain-data" / "events").glob("events-*.jsonl")):
        data = p.read_bytes(); start = time.process_time()
        z = gzip.compress(data, compresslevel=level); seconds += time.process_time() - start
        raw += len(data); zipped += len(z)
    print(f"gzip level {level}: {raw / zipped:.1f}x, {raw / seconds / 1e6:,.0f} MB/s CPU "
          f"({seconds:.2f} s for {raw / 1e6:,.0f} MB)")
for run in map(json.loads, open(out / "results.jsonl")):
    if run.get("kind") == "run":
        print(f"{run['label']}: {run.get('msgs_per_s', 0):,.0f} msg/s ({run.get('status')})")
PY
