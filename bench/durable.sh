#!/usr/bin/env bash
# bench/durable.sh: durable throughput (issue 5) next to the disk's fsync rate and, when it
# is installed, RabbitMQ's in the same run.
#
#   bash bench/durable.sh                  # N=20000 REPS=3
#   N=100000 REPS=5 bash bench/durable.sh
#   PEER=none bash bench/durable.sh        # amqpbroker only; ratio to the RABBIT figure
#
# 1. ../shared/bench/fsync-rate.py in the directory the journal uses: the disk's rate of
#    small synchronous writes (what a broker that syncs every message is bounded by);
# 2. amqp-bench's durable scenario (durable header, 1 KiB, window 1000, C load generator)
#    against amqpbroker with its journal on and `sync: true` (a send is settled only
#    after its group commit) and, with PEER=rabbitmq (the default when the shared
#    harness's setup.sh --apt installed it), against RabbitMQ 3.10 + its AMQP 1.0 plugin
#    configured as the shared harness does (/tmp/bench-rabbitmq, port 5682, durable
#    queues). Reps alternate between the two, so the machine's drift (a shared VM swings
#    by +-30% from one minute to the next) touches both alike, and the broker not being
#    measured is paused (SIGSTOP) meanwhile: an idle Erlang VM's schedulers spin, and on
#    two cores that alone took ~25% off amqpbroker's figure.
# Prints each broker's median msg/s, the fsync rate, messages per fsync, and the ratio of
# the medians (without RabbitMQ: to RABBIT=12400 msg/s, the harness's recorded figure).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=$(cd "$REPO/../shared/bench" && pwd)
N=${N:-20000}
REPS=${REPS:-3}
RABBIT=${RABBIT:-12400}
OUT=${OUT:-/tmp/bench-results/durable-$(date +%Y%m%d-%H%M%S)}
CGEN=/tmp/bench-cgen/amqp-cgen
export RABBIT_HOME=/tmp/bench-rabbitmq
if [ -z "${PEER:-}" ]; then
  PEER=none
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && [ -f $RABBIT_HOME/rabbitmq.conf ] && PEER=rabbitmq
fi
mkdir -p "$OUT/amqpbroker-data"
[ -x "$CGEN" ] || bash "$SHARED/setup.sh" > "$OUT/setup.log" 2>&1
log() { echo "[durable $(date +%T)] $*" >&2; }
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"  # wait_port, amqpbroker_port

PIDS=()
EPMD=0
cleanup() {
  [ -n "${RABBIT_PID:-}" ] && kill -CONT -- "-$RABBIT_PID" 2> /dev/null
  kill -CONT "$OURS" 2> /dev/null
  for pid in "${PIDS[@]}"; do
    for child in $(pgrep -P "$pid" 2>/dev/null); do kill "$child" 2>/dev/null || true; done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # RabbitMQ's epmd daemonizes: ask our own instance (port 4399) to exit.
  [ $EPMD = 1 ] && { ERL_EPMD_PORT=4399 epmd -kill > /dev/null 2>&1 || true; }
}
trap cleanup EXIT

log "fsync rate of $OUT (5 s)"
python3 "$SHARED/fsync-rate.py" --dir "$OUT/amqpbroker-data" --seconds 5 > "$OUT/fsync.json"

cat > "$OUT/amqpbroker.yaml" <<YAML
name: bench-durable
acceptors: [{name: amqp, url: "amqp://127.0.0.1:0"}]
http: {enabled: false}
persistence: {enabled: true, sync: true}
event-log: {enabled: false}
YAML
"$REPO/.venv/bin/amqpbroker" run --config "$OUT/amqpbroker.yaml" \
  --data-dir "$OUT/amqpbroker-data" --log-level warning > "$OUT/amqpbroker.log" 2>&1 &
OURS=$!
PIDS+=("$OURS")
PORT=$(amqpbroker_port "$OUT/amqpbroker-data" "$OURS" "$OUT/amqpbroker.log") || exit 1

if [ "$PEER" = rabbitmq ]; then
  log "starting RabbitMQ (the shared harness's configuration, port 5682)"
  rm -rf $RABBIT_HOME/mnesia/* $RABBIT_HOME/log/*
  setsid bash -c '
    export HOME=$RABBIT_HOME/home RABBITMQ_NODENAME=bench@localhost
    export RABBITMQ_CONFIG_FILE=$RABBIT_HOME/rabbitmq.conf
    export RABBITMQ_ENABLED_PLUGINS_FILE=$RABBIT_HOME/enabled_plugins
    export RABBITMQ_MNESIA_BASE=$RABBIT_HOME/mnesia RABBITMQ_LOG_BASE=$RABBIT_HOME/log
    export RABBITMQ_PID_FILE=$RABBIT_HOME/rabbit.pid RABBITMQ_DIST_PORT=25699
    export ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT=4399
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    exec /usr/lib/rabbitmq/bin/rabbitmq-server
  ' > "$OUT/rabbitmq.log" 2>&1 &
  RABBIT_PID=$!
  PIDS+=("$RABBIT_PID")
  EPMD=1
  wait_port 5682 120 "$RABBIT_PID" || { log "RabbitMQ did not open port 5682 (see $OUT/rabbitmq.log)"; exit 2; }
  sleep 2  # the listener comes up before the AMQP 1.0 plugin is ready
fi

bench() {  # LABEL URL FLAVOR PID
  "$SHARED/amqp-bench" --client c --cgen "$CGEN" --size 1024 -n "$N" --quiet \
    --scenario durable --reps 1 --url "$2" --label "$1" --flavor "$3" --broker-pid "$4" \
    --jsonl "$OUT/results.jsonl" > /dev/null
}
for rep in $(seq "$REPS"); do
  log "rep $rep/$REPS (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  if [ "$PEER" = rabbitmq ]; then
    kill -STOP -- "-$RABBIT_PID"
    bench amqpbroker "amqp://127.0.0.1:$PORT" artemis "$OURS"
    kill -CONT -- "-$RABBIT_PID"
    kill -STOP "$OURS"
    bench rabbitmq "amqp://127.0.0.1:5682" rabbitmq "$RABBIT_PID"
    kill -CONT "$OURS"
  else
    bench amqpbroker "amqp://127.0.0.1:$PORT" artemis "$OURS"
  fi
done
"$SHARED/amqp-bench" --report "$OUT/results.jsonl" | tee "$OUT/table.txt"
python3 - "$OUT" "$RABBIT" <<'PY'
import json, statistics, sys
out, recorded = sys.argv[1], float(sys.argv[2])
rate = json.load(open(f"{out}/fsync.json"))["append_fdatasync"]["ops_per_s"]
rates: dict[str, list[float]] = {}
for line in open(f"{out}/results.jsonl"):
    run = json.loads(line)
    if run.get("kind") == "run" and run.get("status") == "ok":
        rates.setdefault(run["label"], []).append(run["msgs_per_s"])
if not rates.get("amqpbroker"):
    sys.exit(f"durable: no successful amqpbroker run (see {out})")
ours = statistics.median(rates["amqpbroker"])
print(f"\namqpbroker durable msg/s (median of {len(rates['amqpbroker'])}): {ours:,.0f}"
      f"  (runs: {', '.join(f'{r:,.0f}' for r in rates['amqpbroker'])})")
if rate:
    print(f"disk append+fdatasync/s: {rate:,.0f}  -> {ours / rate:.1f} messages per sync")
if rates.get("rabbitmq"):
    peer = statistics.median(rates["rabbitmq"])
    pairs = [a / b for a, b in zip(rates["amqpbroker"], rates["rabbitmq"])]
    print(f"RabbitMQ durable msg/s (median of {len(rates['rabbitmq'])}): {peer:,.0f}"
          f"  (runs: {', '.join(f'{r:,.0f}' for r in rates['rabbitmq'])})")
    print(f"ratio amqpbroker/RabbitMQ, this run: {ours / peer:.2f}x (median of paired runs "
          f"{statistics.median(pairs):.2f}x); target >= 1.3x")
else:
    print(f"ratio to RabbitMQ's recorded durable figure ({recorded:,.0f} msg/s): "
          f"{ours / recorded:.2f}x; target >= 1.3x")
PY
echo "results: $OUT"
