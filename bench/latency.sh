#!/usr/bin/env bash
# bench/latency.sh (issue 20): the shared harness's `latency` scenario (10,000 messages of
# 1 KiB, producer paced at 1,000 msg/s, C generator) against amqpbroker with its shipped
# config and the Qpid Proton C example broker (broker-w1000), reps interleaved, with every
# message's latency kept (bench/latency_cgen.py), run twice per rep:
#   burst  the generator as shipped: it sends its first ~1,000 messages at once after a
#          1 s sleep (docs/decisions.md), so p99 is the time a broker takes to drain them;
#   paced  the same generator paced from its first message: the broker's own path.
# The report gives p50/p99/p99.9/max of all messages and without the first 1,100, and
# per rep our p99 over the C broker's and the burst's drain (first to last delivery).
# Before rep 1 each broker gets the unrecorded warm-up `make bench` gives it (WARMUP
# messages of the queue scenario, as run-peers.sh): a broker's first burst costs it about
# twice the CPU a message of a later one (cold caches and heap), and `make bench` runs
# the latency scenario last, on a warm broker.
#
#   bash bench/latency.sh                 # REPS=3, ~3 min
#   RT=1 bash bench/latency.sh            # brokers and generators under chrt -f 1 (root):
#                                         # the machine's other load does not preempt them
#
# The broker runs from .bench/.venv (`make bench`, compiled) if present, else .venv, or
# PYTHON=/path/to/python. Needs the shared harness's tools (../shared/bench/setup.sh --apt).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=$(cd "${SHARED_BENCH:-$REPO/../shared/bench}" 2> /dev/null && pwd) || {
  echo "latency.sh: $REPO/../shared/bench not found (the shared harness sits beside the repo)" >&2
  exit 2
}
CBROKER=/tmp/bench-peers/cbroker/broker-w1000
[ -x "$CBROKER" ] || { echo "latency.sh: no $CBROKER: bash $SHARED/setup.sh --apt first" >&2; exit 2; }
if [ -z "${PYTHON:-}" ]; then
  PYTHON=$REPO/.venv/bin/python
  [ -x "$REPO/.bench/.venv/bin/python" ] && PYTHON=$REPO/.bench/.venv/bin/python
fi
REPS=${REPS:-3}
WARMUP=${WARMUP:-20000}
OUT=${OUT:-/tmp/bench-results/latency-$(date +%Y%m%d-%H%M%S)}
PRIO=()
[ "${RT:-0}" = 1 ] && PRIO=(chrt -f 1)
mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"

python3 "$REPO/bench/latency_cgen.py" build "$SHARED/cgen/amqp-cgen.c" "$OUT/cgen"

# The shipped config on free loopback ports (run-peers.sh's own ports stay free).
sed -e 's#amqp://127.0.0.1:5672#amqp://127.0.0.1:0#' -e 's#127.0.0.1:8161#127.0.0.1:0#' \
  "$REPO/config/broker.yaml" > "$OUT/broker.yaml"
# From $OUT: `python -m` puts the working directory first on sys.path, and the repo's
# sources would shadow the compiled build installed in .bench/.venv.
(cd "$OUT" && exec "${PRIO[@]}" "$PYTHON" -m amqpbroker run --config "$OUT/broker.yaml" \
  --data-dir "$OUT/data") > "$OUT/amqpbroker.log" 2>&1 &
BROKER_PID=$!
CPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$(dirname "$CBROKER")" && exec "${PRIO[@]}" "$CBROKER" 127.0.0.1 "$CPORT") \
  > "$OUT/cbroker.log" 2>&1 &
CBROKER_PID=$!
trap 'kill "$BROKER_PID" "$CBROKER_PID" 2> /dev/null; wait' EXIT
PORT=$(amqpbroker_port "$OUT/data" "$BROKER_PID" "$OUT/amqpbroker.log")
wait_port "$CPORT" 20 "$CBROKER_PID" || { echo "latency.sh: the C broker did not start" >&2; exit 1; }
BUILD=$(cd "$OUT" && "$PYTHON" -c 'import amqpbroker.core.queue as q; print(q.__file__)')
echo "latency.sh: amqpbroker from $BUILD, results in $OUT; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

if [ "$WARMUP" -gt 0 ]; then
  for broker in amqpbroker cbroker; do
    if [ $broker = amqpbroker ]; then
      url=amqp://127.0.0.1:$PORT flavor=artemis
    else
      url=amqp://127.0.0.1:$CPORT flavor=generic
    fi
    "${PRIO[@]}" "$SHARED/amqp-bench" --cgen "$OUT/cgen/amqp-cgen-burst" --url "$url" \
      --label "$broker-warmup" --flavor $flavor --client c --scenario queue -n "$WARMUP" \
      --reps 1 --jsonl "$OUT/warmup.jsonl" --quiet > /dev/null
  done
fi
for ((rep = 1; rep <= REPS; rep++)); do
  for gen in burst paced; do
    for broker in amqpbroker cbroker; do
      if [ $broker = amqpbroker ]; then
        url=amqp://127.0.0.1:$PORT flavor=artemis pid=$BROKER_PID
      else
        url=amqp://127.0.0.1:$CPORT flavor=generic pid=$CBROKER_PID
      fi
      LAT_DUMP=$OUT/$broker.$gen.$rep.lat "${PRIO[@]}" "$SHARED/amqp-bench" \
        --cgen "$OUT/cgen/amqp-cgen-$gen" --url "$url" --label "$broker-$gen" \
        --flavor $flavor --client c --scenario latency --reps 1 --rep-start "$rep" \
        --broker-pid "$pid" --jsonl "$OUT/results.jsonl" --quiet > /dev/null
    done
  done
  echo "latency.sh: rep $rep done; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
python3 "$REPO/bench/latency_cgen.py" report "$OUT" | tee "$OUT/table.txt"
