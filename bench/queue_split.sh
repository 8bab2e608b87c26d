#!/usr/bin/env bash
# bench/queue_split.sh: where the queue scenario's CPU goes, rep by rep (issue 20): the
# broker's loop process and its event-log writer process apart, which `make bench`'s
# "broker CPU" (the process tree) sums. With the shipped config the writer process costs
# about as much per message as the loop, and it runs at nice 10 behind the 64 MiB
# hand-off: a rep measures as much of its work as happens to fall inside the rep
# (docs/performance.md, "Why the queue figure swings"). Also prints the writer's lag at
# the end of the rep (amqpbroker_event_log_pending_events).
#
#   bash bench/queue_split.sh                       # REPS=5 N=50000, shipped config
#   PYTHON=/tmp/cv/bin/python REPS=8 bash bench/queue_split.sh   # a compiled build
#   EVENT_LOG=off bash bench/queue_split.sh
#   PRE="chrt -r 1" CPRE="chrt -f 2" bash bench/queue_split.sh   # as root: shielded from
#                                        # other load (the writer process sets itself to
#                                        # SCHED_BATCH: then it gets what others leave)
#
# Per rep: msg/s; CPU microseconds a message of the loop process (all its threads), of the
# writer process, of producer + consumer; the cores all of them used over the rep; the
# writer's pending events at the end of the rep. Wall-clock figures follow the machine's
# load; the CPU split is the point.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$REPO/../shared/bench/amqp-bench
PYTHON=${PYTHON:-$([ -x "$REPO/.bench/.venv/bin/python" ] && echo "$REPO/.bench/.venv/bin/python" || echo "$REPO/.venv/bin/python")}
N=${N:-50000}
REPS=${REPS:-5}
OUT=$(mktemp -d /tmp/amqpbroker-split.XXXXXX)
[ -x "$BENCH" ] && [ -x /tmp/bench-cgen/amqp-cgen ] || {
  echo "queue_split.sh: run bash $REPO/../shared/bench/setup.sh first" >&2
  exit 2
}
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"  # amqpbroker_port

sed -e 's#amqp://127.0.0.1:5672#amqp://127.0.0.1:0#' -e 's#127.0.0.1:8161#127.0.0.1:0#' \
  "$REPO/config/broker.yaml" > "$OUT/broker.yaml"
[ "${EVENT_LOG:-on}" = off ] && sed -i '/^event-log:/,/enabled/ s/enabled: true/enabled: false/' "$OUT/broker.yaml"
# shellcheck disable=SC2086  # PRE and CPRE are command prefixes
(cd "$OUT" && exec ${PRE:-} "$PYTHON" -m amqpbroker run --config broker.yaml --data-dir data \
  --log-level warning) > "$OUT/broker.log" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2> /dev/null || true; wait $PID 2> /dev/null || true' EXIT
PORT=$(amqpbroker_port "$OUT/data" "$PID" "$OUT/broker.log")
HTTP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["http"])' "$OUT/data/ports.json")
sleep 1
WRITER=$(ps -o pid= --ppid "$PID" | tr -d ' ' | head -1 || true)  # none with the log off

cpu() {  # PID: utime + stime of all its threads, in clock ticks (0 if none)
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || { echo 0; return; }
  python3 -c 'import sys; s=open(sys.argv[1]).read(); r=s[s.rfind(")")+2:].split(); print(int(r[11])+int(r[12]))' "/proc/$1/stat"
}
pending() {
  python3 - "$HTTP" << 'PY'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
print(next((int(float(l.split()[-1])) for l in text.splitlines()
            if l.startswith("amqpbroker_event_log_pending_events ")), -1))
PY
}
run() {  # N JSONL REP
  # shellcheck disable=SC2086
  ${CPRE:-} "$BENCH" --url "amqp://127.0.0.1:$PORT" --label amqpbroker --flavor artemis --client c \
    --scenario queue -n "$1" --reps 1 --rep-start "$3" --jsonl "$2" --quiet > /dev/null
}
run 10000 "$OUT/warmup.jsonl" 0
HZ=$(getconf CLK_TCK)
echo "queue N=$N python=$PYTHON event-log=${EVENT_LOG:-on} ($OUT)"
echo "rep    msg/s  loop us/msg  writer us/msg  clients us/msg  cores  writer pending at end"
for ((rep = 1; rep <= REPS; rep++)); do
  sleep "${GAP:-2}"
  l0=$(cpu "$PID"); w0=$(cpu "$WRITER")
  run "$N" "$OUT/results.jsonl" "$rep"
  l1=$(cpu "$PID"); w1=$(cpu "$WRITER")
  behind=$(pending)
  python3 - "$OUT/results.jsonl" "$rep" "$N" "$HZ" "$l0" "$l1" "$w0" "$w1" "$behind" << 'PY'
import json, sys
f, rep, n, hz, l0, l1, w0, w1, behind = sys.argv[1:]
r = [x for x in map(json.loads, open(f)) if x.get("rep") == int(rep)][-1]
n, hz = int(n), int(hz)
loop = (int(l1) - int(l0)) / hz
writer = (int(w1) - int(w0)) / hz
clients = (r["cpu_s"]["producer"] or 0) + (r["cpu_s"]["consumers"] or 0)
per = lambda s: s / n * 1e6
print("%3s %8.0f %12.1f %14.1f %15.1f %6.2f %22s" % (
    rep, r.get("msgs_per_s") or 0, per(loop), per(writer), per(clients),
    (loop + writer + clients) / r["wall_s"], behind))
PY
done
