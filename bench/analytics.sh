#!/usr/bin/env bash
# bench/analytics.sh: wall time of `amqpbroker analyze` on a synthetic event log.
#
#   bash bench/analytics.sh                 # EVENTS=1000000
#   EVENTS=10000000 bash bench/analytics.sh # ~4.6 GB of JSON lines; generating takes ~3 min
#   COMPRESS=1 bash bench/analytics.sh      # the same log gzipped (-1), as the broker
#                                           # leaves rotated files (issue 17)
#
# The log (tests/support/synth_events.py: planted poison payloads and an outage window)
# is generated once into $DIR (default /tmp/amqpbroker-synth-$EVENTS) and reused; each
# run writes a fresh report directory, so compaction always reads every file. Prints the
# job's own summary and the wall time of the whole command (JVM start included), then
# the wall time of a second run over the same report directory.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EVENTS=${EVENTS:-1000000}
DIR=${DIR:-/tmp/amqpbroker-synth-$EVENTS}
OUT=${OUT:-/tmp/amqpbroker-report-$EVENTS}
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || { echo "analytics.sh: run 'make test' first (creates .venv)" >&2; exit 2; }

if [ ! -d "$DIR" ]; then
  PYTHONPATH="$REPO/tests" "$PY" -m support.synth_events "$DIR" --events "$EVENTS"
fi
if [ "${COMPRESS:-0}" = 1 ]; then  # not GZIP: gzip reads that variable
  if [ ! -d "$DIR-gz" ]; then
    mkdir "$DIR-gz.tmp"
    for f in "$DIR"/*.jsonl; do gzip -1 -c "$f" > "$DIR-gz.tmp/$(basename "$f").gz"; done
    mv "$DIR-gz.tmp" "$DIR-gz"
  fi
  DIR="$DIR-gz"
  OUT="$OUT-gz"
fi
echo "input: $(du -sb "$DIR" | cut -f1) bytes in $DIR"
rm -rf "$OUT"
start=$(date +%s%N)
PYTHONPATH="$REPO" "$PY" -m amqpbroker analyze --events "$DIR" --out "$OUT" --window 60
end=$(date +%s%N)
echo "wall time: $(( (end - start) / 1000000 )) ms for $EVENTS events ($DIR)"
# The second run over the same --out: compaction finds no new file (issue 22 item 8).
start=$(date +%s%N)
PYTHONPATH="$REPO" "$PY" -m amqpbroker analyze --events "$DIR" --out "$OUT" --window 60 > /dev/null
end=$(date +%s%N)
echo "second run wall time: $(( (end - start) / 1000000 )) ms (no new file)"
