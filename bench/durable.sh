#!/usr/bin/env bash
# bench/durable.sh: durable throughput (issue 5) next to the disk's fsync rate, one run.
#
#   bash bench/durable.sh                 # N=20000 REPS=3
#   N=100000 REPS=3 bash bench/durable.sh
#
# 1. ../shared/bench/fsync-rate.py in the directory the journal uses: the disk's rate of
#    small synchronous writes (what a broker that syncs every message is bounded by);
# 2. bench/run.sh with ONLY=amqpbroker PERSIST=1 SCENARIOS=durable: amqp-bench's durable
#    scenario (durable header, 1 KiB, window 1000) against amqpbroker with its journal on
#    and `sync: true`: a send is settled only after its group commit.
# Prints msg/s, the fsync rate, messages per fsync, and the ratio to the RabbitMQ figure
# the shared harness reports for this scenario (RABBIT=12400 msg/s; override to compare).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=$(cd "$REPO/../shared/bench" && pwd)
export N=${N:-20000} REPS=${REPS:-3}
RABBIT=${RABBIT:-12400}
OUT=${OUT:-/tmp/bench-results/durable-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/amqpbroker-data"

echo "[durable] fsync rate of $OUT (5 s)" >&2
python3 "$SHARED/fsync-rate.py" --dir "$OUT/amqpbroker-data" --seconds 5 > "$OUT/fsync.json"
OUT=$OUT ONLY=amqpbroker PERSIST=1 SCENARIOS=durable bash "$REPO/bench/run.sh" > "$OUT/run.txt"
cat "$OUT/run.txt"
python3 - "$OUT" "$RABBIT" <<'PY'
import json, statistics, sys
out, rabbit = sys.argv[1], float(sys.argv[2])
fsync = json.load(open(f"{out}/fsync.json"))
rate = fsync["append_fdatasync"]["ops_per_s"]
runs = [json.loads(l) for l in open(f"{out}/results.jsonl")]
ok = [r["msgs_per_s"] for r in runs if r.get("kind") == "run" and r.get("status") == "ok"]
if not ok:
    sys.exit("durable: no successful run (see %s)" % out)
med = statistics.median(ok)
print(f"durable msg/s (median of {len(ok)}): {med:,.0f}")
if rate:
    print(f"disk append+fdatasync/s: {rate:,.0f}  -> {med / rate:.1f} messages per sync")
print(f"ratio to RabbitMQ's durable figure ({rabbit:,.0f} msg/s): {med / rabbit:.2f}x")
PY
