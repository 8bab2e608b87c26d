"""Compaction: event-log JSON lines -> Parquet partitioned by date, incrementally.

A Structured Streaming file source with `trigger(availableNow=True)` and a checkpoint
under `--out` reads every `*.jsonl` and `*.jsonl.gz` file (the broker gzips rotated files
by default; Spark decompresses by the suffix) it has not read before, in one batch, then
stops: a second run over the same directory reads only the files the broker has rotated
since. `.part` files are never read (B-170: they are still being written). The sink's
`_spark_metadata` log lists only committed files, so a run killed halfway leaves the
store readable and the next run redoes the batch.

After a compaction, `mark_compacted` writes COMPACTED_MARKER into the events directory:
the names of the files compacted (listed before the stream started, so `availableNow`
read them all), which a broker with `event-log.keep-until-analyzed: true` never deletes
before (issue 17; docs/analytics.md).

Malformed lines never stop the job: each line is parsed on its own (`from_json`, PERMISSIVE
with a corrupt-record column), and such rows are stored with their text so they can be
counted (and inspected) later; every table reads `valid_events()` only. A line holding a
JSON array is one malformed line, not several events (issue 22 item 6: the JSON file
reader would split it). Each row keeps the name of its `file`: a file never spans two
runs of the broker, which is how restarts and `seq` gaps are found (item 2).

One `--out` belongs to one events directory: SOURCE_FILE records which, and a run with
another directory is refused (item 6: it would merge two logs).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, StructField, StructType

from amqpbroker.analytics.schema import CORRUPT_RECORD, RAW_SCHEMA

# Columns with (nearly) one value per row: Parquet dictionary encoding only costs there
# (measured: it doubles the write time of 1M events and makes the files bigger).
# The event files the broker finishes: plain, and gzipped (event-log.compress).
EVENT_FILES = ("*.jsonl", "*.jsonl.gz")
# amqpbroker.eventlog.retention.COMPACTED_MARKER (a test checks they agree; the broker's
# modules are not imported here).
COMPACTED_MARKER = ".compacted.json"
SOURCE_FILE = "source.json"  # in --out: the events directory this store was made from
# What `compact` writes: the parsed line, its file's name (never null), and the date it is
# partitioned by; what a read inferring the schema would find.
STORED_SCHEMA = StructType(
    [
        *RAW_SCHEMA.fields,
        StructField("file", StringType(), nullable=False),
        StructField("date", DateType()),
    ]
)
_NO_DICTIONARY = ("ts", "seq", "msg_id", "first_ts", "copy_msg_id", "amqp_message_id", "body_hash")


@dataclass(frozen=True)
class Store:
    """Where one `--out` keeps the compacted events and the stream's checkpoint."""

    out: Path

    @property
    def events(self) -> Path:
        return self.out / "events"

    @property
    def checkpoint(self) -> Path:
        return self.out / "_checkpoint" / "compact"

    @property
    def state(self) -> Path:
        """The partials of the tables (analytics/state.py)."""
        return self.out / "_state"


def event_files(events_dir: Path) -> list[str]:
    """Names of the finished event files in `events_dir`."""
    return sorted(p.name for pattern in EVENT_FILES for p in events_dir.glob(pattern))


def open_files(events_dir: Path) -> list[Path]:
    """The `.part` files: being written (or left by a crash), never read (B-170)."""
    return sorted(events_dir.glob("*.jsonl.part"))


def claim(store: Store, events_dir: Path) -> None:
    """Record that `store` is made from `events_dir`, or refuse another directory.

    Raises:
        ValueError: the store was made from another directory (the message says which).
    """
    source = store.out / SOURCE_FILE
    mine = str(events_dir.resolve())
    try:
        recorded = json.loads(source.read_text()).get("events")
    except (OSError, ValueError, AttributeError, RecursionError):  # nested deep: Recursion
        recorded = None
    if recorded is None and store.events.exists():
        raise ValueError(
            f"{store.out} holds compacted events of an unknown events directory "
            "(no source.json): use a new --out"
        )
    if recorded is not None and recorded != mine:
        raise ValueError(
            f"{store.out} holds the events of {recorded}, not {mine}: use another --out "
            "(one report directory per event log, or two logs are merged)"
        )
    if recorded is None:
        store.out.mkdir(parents=True, exist_ok=True)
        source.write_text(json.dumps({"events": mine}) + "\n")


def compact(spark: SparkSession, events_dir: Path, store: Store) -> int:
    """Append the lines of not-yet-read event files to the store; return how many."""
    lines = (
        spark.readStream
        # The default (7 days, relative to the newest file) would silently skip an old
        # file copied in later; the seen-files log is small next to the events.
        .option("maxFileAge", "3650d")
        .text(str(events_dir.resolve() / "*.{jsonl,jsonl.gz}"))
        .where(F.trim("value") != "")
    )
    parsed = F.from_json(
        "value",
        RAW_SCHEMA,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_RECORD},
    )
    source = lines.select(parsed.alias("e"), F.col("_metadata.file_name").alias("file")).select(
        "e.*", "file"
    )
    writer = (
        source.withColumn("date", F.to_date(F.timestamp_millis("ts")))
        .writeStream.format("parquet")
        .option("path", str(store.events.resolve()))
        .option("checkpointLocation", str(store.checkpoint.resolve()))
        .partitionBy("date")
        # zstd: measured as fast as snappy to write here and a third of the size.
        .option("compression", "zstd")
        .trigger(availableNow=True)
    )
    for column in _NO_DICTIONARY:
        writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
    query = writer.start()
    query.awaitTermination()
    if query.exception() is not None:  # pragma: no cover - awaitTermination raises first
        raise RuntimeError(str(query.exception()))
    return sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)


def mark_compacted(events_dir: Path, names: list[str]) -> None:
    """Record in COMPACTED_MARKER that `names` are compacted (with what earlier runs
    recorded, for the files still there), replacing the marker atomically.

    Raises:
        OSError: the events directory is not writable (the caller says so and goes on).
    """
    marker = events_dir / COMPACTED_MARKER
    try:
        earlier = json.loads(marker.read_bytes()).get("files", [])
    except (OSError, ValueError, AttributeError, RecursionError):  # nested deep: Recursion
        earlier = []
    if not isinstance(earlier, list):  # third attack pass: `"files": 5` raised TypeError
        earlier = []
    present = set(event_files(events_dir))
    done = sorted(n for n in {*names, *earlier} if isinstance(n, str) and n in present)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"files": done}) + "\n")
    os.replace(tmp, marker)


def valid() -> Column:
    """The fields every event has (B-170); a row without them is a malformed line."""
    return (
        F.col(CORRUPT_RECORD).isNull()
        & F.col("ts").isNotNull()
        & F.col("event").isNotNull()
        & F.col("msg_id").isNotNull()
    )


def stored_events(spark: SparkSession, store: Store) -> DataFrame:
    """Everything compacted so far, malformed lines included. With its schema given: an
    inferred one costs a Spark job (reading a footer) per run."""
    return spark.read.schema(STORED_SCHEMA).parquet(str(store.events.resolve()))


def valid_events(stored: DataFrame) -> DataFrame:
    """The events the tables read: parsed, with the fields every event has (B-170)."""
    return stored.where(valid()).drop(CORRUPT_RECORD)


def overview(
    files: list[dict[str, Any]],
) -> tuple[int, int, int | None, int | None]:
    """(valid events, malformed lines, first ts, last ts) of the per-file rows
    (state.file_rows: broker, first and last `seq`, `events` (lines with a seq), `valid`,
    `malformed`, `first_ts`, `last_ts`), which report.broker_runs also reads to find
    restarts and seq gaps (B-170: seq starts at 1 with every writer, a file never spans
    two runs)."""
    firsts = [f["first_ts"] for f in files if f["first_ts"] is not None]
    lasts = [f["last_ts"] for f in files if f["last_ts"] is not None]
    return (
        sum(int(f["valid"] or 0) for f in files),
        sum(int(f["malformed"] or 0) for f in files),
        min(firsts, default=None),
        max(lasts, default=None),
    )
