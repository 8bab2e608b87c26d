#!/usr/bin/env bash
# bench/run.sh: amqpbroker vs the Qpid Proton C example broker, in ONE run, same machine.
#
#   bash bench/run.sh                       # N=20000 REPS=1, scenarios queue,fanout (~1 min)
#   N=100000 REPS=3 bash bench/run.sh       # the longer, steadier figure
#   ONLY=cbroker bash bench/run.sh          # only the C broker (ONLY=amqpbroker: only ours)
#
# Environment knobs (defaults):
#   N=20000  REPS=1  SIZE=1024  SCENARIOS=queue,fanout
#   IDLE=10       worker idle timeout (s); a scenario the C broker cannot do costs this once
#   WARMUP=0      unrecorded queue warm-up run of this many messages per broker, rep 1
#   ONLY          unset: both brokers; cbroker or amqpbroker: just that one
#   PERSIST=1     amqpbroker with its journal on (sync: true), for SCENARIOS=durable
#   OUT=/tmp/bench-results/<timestamp>   results.jsonl, table.txt, broker logs
#
# Uses the shared harness beside the repo ($REPO/../shared/bench): amqp-bench with the C
# load generator (amqp-cgen) and the Qpid Proton C example broker with its producer
# window raised to 1000 (broker-w1000); builds them with its setup.sh if missing.
# Both brokers listen on loopback only, on free ports, and are stopped by PID on exit.
# Reps are interleaved (rep 1 of each broker, then rep 2, ...) so drifting machine load
# hurts the ratio less.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=$(cd "$REPO/../shared/bench" 2>/dev/null && pwd) || {
  echo "run.sh: $REPO/../shared/bench not found (the shared harness sits beside the repo)" >&2
  exit 2
}
BENCH="$SHARED/amqp-bench"
N=${N:-20000}
REPS=${REPS:-1}
SIZE=${SIZE:-1024}
SCENARIOS=${SCENARIOS:-queue,fanout}
IDLE=${IDLE:-10}
WARMUP=${WARMUP:-0}
ONLY=${ONLY:-}
OUT=${OUT:-/tmp/bench-results/$(date +%Y%m%d-%H%M%S)}
CGEN=/tmp/bench-cgen/amqp-cgen
CBROKER=/tmp/bench-peers/cbroker/broker-w1000
JSONL="$OUT/results.jsonl"

case "$ONLY" in
  "" | cbroker | amqpbroker) ;;
  *) echo "run.sh: ONLY must be cbroker or amqpbroker (or unset for both)" >&2; exit 2 ;;
esac
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }
log() { echo "[bench $(date +%T)] $*" >&2; }

mkdir -p "$OUT"

# ---------------------------------------------------------------- tools
if [ ! -x "$CGEN" ] || [ ! -x "$CBROKER" ]; then
  if [ ! -f /usr/include/proton/proactor.h ] || [ ! -f /usr/share/proton/examples/c/broker.c ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      log "installing the Qpid Proton C packages (apt-get)"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        libqpid-proton11-dev libqpid-proton11-dev-examples python3-venv gcc >/dev/null
    else
      echo "run.sh: need libqpid-proton11-dev and libqpid-proton11-dev-examples:" \
           "bash $SHARED/setup.sh --apt (as root)" >&2
      exit 2
    fi
  fi
  log "building the load generator and the C broker ($SHARED/setup.sh)"
  bash "$SHARED/setup.sh" > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log" >&2; exit 2; }
fi
[ -x "$CGEN" ] && [ -x "$CBROKER" ] || { echo "run.sh: $CGEN or $CBROKER missing after setup" >&2; exit 2; }

if want amqpbroker && [ ! -x "$REPO/.venv/bin/amqpbroker" ]; then
  log "creating $REPO/.venv (pip install -e .)"
  python3 -m venv "$REPO/.venv"
  "$REPO/.venv/bin/python" -m pip install -q -e "$REPO"
fi

# ---------------------------------------------------------------- brokers
declare -A PID=() PORT=() FLAVOR=()

stop_pid() {   # pid name: SIGTERM, wait up to 20 s, then SIGKILL
  local pid=$1 name=$2 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 40; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name (pid $pid) did not stop after SIGTERM, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local b
  for b in "${!PID[@]}"; do stop_pid "${PID[$b]}" "$b"; done
}
trap cleanup EXIT
# Ctrl-C stops at once; a SIGTERM sent to this script alone takes effect (and stops the
# brokers) when the running amqp-bench call returns.
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"  # wait_port, amqpbroker_port

if want cbroker; then
  PORT[cbroker]=$(free_port)
  (cd "$(dirname "$CBROKER")" && exec "$CBROKER" 127.0.0.1 "${PORT[cbroker]}") > "$OUT/cbroker.log" 2>&1 &
  PID[cbroker]=$!
  FLAVOR[cbroker]=generic
  wait_port "${PORT[cbroker]}" 10 "${PID[cbroker]}" || {
    echo "run.sh: C broker did not open port ${PORT[cbroker]} (see $OUT/cbroker.log)" >&2; exit 1; }
  log "cbroker (broker-w1000) up: pid ${PID[cbroker]} port ${PORT[cbroker]}"
fi

if want amqpbroker; then
  DATA="$OUT/amqpbroker-data"
  mkdir -p "$DATA"
  rm -f "$DATA/ports.json"
  PERSISTENCE="{enabled: false}"
  [ "${PERSIST:-0}" = 1 ] && PERSISTENCE="{enabled: true, sync: true}"
  cat > "$OUT/amqpbroker.yaml" <<YAML
# bench/run.sh: no event log, ports chosen by the OS (-> ports.json); PERSIST=1: journal
acceptors:
  - {name: amqp, url: "amqp://127.0.0.1:0"}
http: {bind: "127.0.0.1:0"}
persistence: $PERSISTENCE
event-log: {enabled: false}
YAML
  "$REPO/.venv/bin/amqpbroker" run --config "$OUT/amqpbroker.yaml" --data-dir "$DATA" \
    --log-level warning > "$OUT/amqpbroker.log" 2>&1 &
  PID[amqpbroker]=$!
  FLAVOR[amqpbroker]=artemis
  PORT[amqpbroker]=$(amqpbroker_port "$DATA" "${PID[amqpbroker]}" "$OUT/amqpbroker.log") || exit 1
  wait_port "${PORT[amqpbroker]}" 10 "${PID[amqpbroker]}" || {
    echo "run.sh: amqpbroker not accepting on ${PORT[amqpbroker]} (see $OUT/amqpbroker.log)" >&2; exit 1; }
  log "amqpbroker up: pid ${PID[amqpbroker]} port ${PORT[amqpbroker]}"
fi

# ---------------------------------------------------------------- measure
{ uptime; nproc; git -C "$REPO" rev-parse --short HEAD 2>/dev/null || true; } > "$OUT/machine.txt"
log "results in $OUT (N=$N size=$SIZE reps=$REPS scenarios=$SCENARIOS)"
ORDER=()
want cbroker && ORDER+=(cbroker)
want amqpbroker && ORDER+=(amqpbroker)
for ((rep = 1; rep <= REPS; rep++)); do
  for b in "${ORDER[@]}"; do
    w=0; [ "$rep" = 1 ] && w=$WARMUP
    log "$b rep $rep: $SCENARIOS (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    rc=0
    # --skip-failed-in: a scenario a broker cannot do (the C broker has no multicast)
    # fails once and is skipped in later reps.
    "$BENCH" --url "amqp://127.0.0.1:${PORT[$b]}" --label "$b" --flavor "${FLAVOR[$b]}" \
      --client c --cgen "$CGEN" --scenario "$SCENARIOS" -n "$N" -s "$SIZE" \
      --reps 1 --rep-start "$rep" --broker-pid "${PID[$b]}" --idle-timeout "$IDLE" \
      --warmup "$w" --jsonl "$JSONL" --skip-failed-in "$JSONL" --quiet > /dev/null || rc=$?
    # rc 1: some run failed (recorded in the JSONL, shown in the table); more: harness error
    [ "$rc" -le 1 ] || { echo "run.sh: amqp-bench failed (exit $rc) against $b" >&2; exit 1; }
    kill -0 "${PID[$b]}" 2>/dev/null || { echo "run.sh: $b died during the run (see $OUT/$b.log)" >&2; exit 1; }
  done
done

# ---------------------------------------------------------------- report
echo
"$BENCH" --report "$JSONL" | tee "$OUT/table.txt"
echo
python3 - "$JSONL" <<'PY' | tee -a "$OUT/table.txt"
import json, statistics, sys

rates, deliv, failed, scen = {}, {}, set(), []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") != "run":
        continue
    key = (r["label"], r["scenario"])
    if r["scenario"] not in scen:
        scen.append(r["scenario"])
    if r.get("status") == "ok" and r.get("msgs_per_s"):
        rates.setdefault(key, []).append(r["msgs_per_s"])
        deliv.setdefault(key, []).append(r.get("deliveries_per_s") or 0)
    else:
        failed.add(key)

def med(d, k):
    return statistics.median(d[k]) if k in d else None

def cell(k):
    if k in rates:
        return "{:,.0f}".format(med(rates, k))
    return "failed" if k in failed else "-"

print("ratio = amqpbroker msg/s / cbroker msg/s (medians, this run only)")
print("%-10s %16s %14s %8s   %s" % ("scenario", "amqpbroker msg/s", "cbroker msg/s", "ratio", "note"))
for s in scen:
    ours, ref = med(rates, ("amqpbroker", s)), med(rates, ("cbroker", s))
    note = ""
    if s == "fanout" and ours:
        note = "amqpbroker deliveries/s %s" % "{:,.0f}".format(med(deliv, ("amqpbroker", s)))
    if ours and ref:
        ratio = "%.2f" % (ours / ref)
    else:
        ratio = "-"
        if ("cbroker", s) in failed:
            note = ("C broker: not supported (no multicast); " + note).rstrip("; ")
    print("%-10s %16s %14s %8s   %s" % (s, cell(("amqpbroker", s)), cell(("cbroker", s)), ratio, note))
PY
echo "results: $JSONL"
