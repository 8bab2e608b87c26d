#!/usr/bin/env bash
# bench/peers.sh (`make bench`, issue 20): amqpbroker as it ships (config/broker.yaml:
# journal with sync, event log at level lifecycle) against the Qpid Proton C example
# broker (producer window 1000) and RabbitMQ 3.10, with the shared harness
# (../shared/bench/run-peers.sh): C load generator, 1 KiB bodies, reps interleaved so that
# drifting machine load hurts the ratios less. Prints run-peers.sh's table.
#
#   make bench                               # N=50000 REPS=3 WARMUP=10000, ~15 min
#   N=10000 REPS=1 make bench                # a quick look
#   PEERS="amqpbroker cbroker-w1000" bash bench/peers.sh
#
# The broker runs from .bench/.venv (`make bench` installs it there, mypyc-compiled),
# else from .venv (pure Python). Needs the shared harness's tools: bash
# ../shared/bench/setup.sh --apt (as root) once; run as root, this script does that itself.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=$(cd "${SHARED_BENCH:-$REPO/../shared/bench}" 2> /dev/null && pwd) || {
  echo "peers.sh: $REPO/../shared/bench not found (the shared harness sits beside the repo)" >&2
  exit 2
}
if [ ! -x /tmp/bench-cgen/amqp-cgen ] || [ ! -x /tmp/bench-peers/cbroker/broker-w1000 ] ||
   ! command -v rabbitmq-server > /dev/null; then
  if [ "$(id -u)" = 0 ]; then
    bash "$SHARED/setup.sh" --apt
  else
    echo "peers.sh: run bash $SHARED/setup.sh --apt (as root) first" >&2
    exit 2
  fi
fi

# run-peers.sh starts "$AMQPBROKER_REPO/.venv/bin/amqpbroker" on
# "$AMQPBROKER_REPO/config/broker.yaml": .bench holds the compiled venv and a link to config.
BROKER_REPO=$REPO
if [ -x "$REPO/.bench/.venv/bin/amqpbroker" ]; then
  ln -sfn ../config "$REPO/.bench/config"
  BROKER_REPO=$REPO/.bench
fi
[ -x "$BROKER_REPO/.venv/bin/amqpbroker" ] || {
  echo "peers.sh: no $BROKER_REPO/.venv/bin/amqpbroker: run make bench (or make run) first" >&2
  exit 2
}
echo "peers.sh: amqpbroker from $BROKER_REPO/.venv; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
AMQPBROKER_REPO=$BROKER_REPO PEERS=${PEERS:-"amqpbroker cbroker-w1000 rabbitmq"} \
  CLIENTS=${CLIENTS:-c} N=${N:-50000} REPS=${REPS:-3} CEILING=${CEILING:-0} \
  WARMUP=${WARMUP:-10000} exec bash "$SHARED/run-peers.sh"
