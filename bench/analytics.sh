#!/usr/bin/env bash
# bench/analytics.sh: wall time of `amqpbroker analyze` on a synthetic event log.
#
#   bash bench/analytics.sh                 # EVENTS=1000000
#   EVENTS=10000000 bash bench/analytics.sh # ~4.6 GB of JSON lines; generating takes ~3 min
#
# The log (tests/support/synth_events.py: planted poison payloads and an outage window)
# is generated once into $DIR (default /tmp/amqpbroker-synth-$EVENTS) and reused; each
# run writes a fresh report directory, so compaction always reads every file. Prints the
# job's own summary and the wall time of the whole command (JVM start included).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EVENTS=${EVENTS:-1000000}
DIR=${DIR:-/tmp/amqpbroker-synth-$EVENTS}
OUT=${OUT:-/tmp/amqpbroker-report-$EVENTS}
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "analytics.sh: run 'make test' first (creates .venv)" >&2; exit 2; }

if [ ! -d "$DIR" ]; then
  PYTHONPATH="$REPO/tests" "$PY" -m support.synth_events "$DIR" --events "$EVENTS"
fi
rm -rf "$OUT"
start=$(date +%s%N)
"$REPO/.venv/bin/amqpbroker" analyze --events "$DIR" --out "$OUT" --window 60
end=$(date +%s%N)
echo "wall time: $(( (end - start) / 1000000 )) ms for $EVENTS events ($DIR)"
