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
# run of this script writes a fresh report directory, so the first run reads every file.
# Prints the job's own summary and the wall time of the whole command (JVM start
# included), then the wall times of two second runs over the same report directory: one
# with no new file, one after the broker's next file ($MORE events, default 11000) is
# added (issue 22 item 8).
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
# The run reads a directory of links to the log, so the increment below can be added to it
# without touching $DIR (and the next first run is a first run again).
WORK="$OUT.events"
rm -rf "$OUT" "$WORK"
mkdir -p "$WORK"
for f in "$DIR"/*; do ln -s "$f" "$WORK/"; done
run() {
  local start end
  start=$(date +%s%N)
  PYTHONPATH="$REPO" "$PY" -m amqpbroker analyze --events "$WORK" --out "$OUT" --window 60 "$@"
  end=$(date +%s%N)
  echo "wall time: $(( (end - start) / 1000000 )) ms" >&2
}
echo "== first run ($EVENTS events, load: $(cut -d' ' -f1-3 /proc/loadavg))"
run
echo "== second run, no new file (load: $(cut -d' ' -f1-3 /proc/loadavg))"
run > /dev/null
# The same broker's next rotated files: $MORE events (seq and message ids continue), the
# next day. Issue 22 item 8: this run costs what the new files cost.
MORE=${MORE:-11000}
if [ ! -d "$DIR-more-$MORE" ]; then
  seqs=$(zcat -f "$DIR"/* | grep -c '"seq":[0-9]')
  PYTHONPATH="$REPO/tests" "$PY" -m support.synth_events "$DIR-more-$MORE" --events "$MORE" \
    --seed 8 --start-ms 1767312000000 --first-id 1000000000 --first-seq $((seqs + 1)) \
    --prefix events-synth-more
fi
for f in "$DIR-more-$MORE"/*; do ln -s "$f" "$WORK/"; done
echo "== second run, $MORE new events (load: $(cut -d' ' -f1-3 /proc/loadavg))"
run > /dev/null
