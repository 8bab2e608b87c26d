"""`amqpbroker analyze`: the dead-letter triage job over the lifecycle event log.

Runs the same way three ways: `amqpbroker analyze ...` (local Spark, `--master local[*]`
by default), `amqpbroker analyze --master spark://HOST:7077 ...`, and
`spark-submit [--master URL] amqpbroker/analytics/job.py ...` (this file is the script:
spark-submit decides the master then, unless `--master` is given here too). Only the
DataFrame API is used, no Python UDFs, so executors need no amqpbroker install.

Steps: compact new `*.jsonl` and `*.jsonl.gz` files into Parquet (ingest.py), then
compute every table from the compacted store (tables.py), write them under `--out/tables/`, then
report.html, summary.json and redrive.jsonl (report.py). See docs/analytics.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from amqpbroker.analytics import ingest, report, state, tables
from amqpbroker.analytics.progress import Progress
from amqpbroker.analytics.tables import TriageSettings

DEFAULT_MASTER = "local[*]"
STEPS = 7


class AnalyzeError(Exception):
    """Bad input the user can fix: one line on stderr, exit 1 (CONTRACT "Command line")."""


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    events: Path
    out: Path
    master: str | None = None
    driver_memory: str = "4g"
    settings: TriageSettings = field(default_factory=TriageSettings)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    defaults = TriageSettings()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Dead-letter triage and a redrive list from the lifecycle event log "
        "(PySpark). Writes Parquet tables, report.html, summary.json and redrive.jsonl.",
    )
    parser.add_argument("--events", required=True, type=Path, metavar="DIR", help="DATA_DIR/events")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="report directory")
    parser.add_argument(
        "--master",
        metavar="MASTER",
        help=f"Spark master URL (default {DEFAULT_MASTER}; under spark-submit: its --master)",
    )
    parser.add_argument(
        "--driver-memory", default="4g", metavar="SIZE", help="local driver heap (default 4g)"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=defaults.window_ms / 1000,
        metavar="SECONDS",
        help=f"time window of the per-queue tables (default {defaults.window_ms // 1000})",
    )
    parser.add_argument(
        "--transient-conditions",
        default=",".join(defaults.transient_conditions),
        metavar="LIST",
        help="comma-separated error conditions whose dead-letters are redrive candidates "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--outage-min-failures", type=int, default=defaults.outage_min_failures, metavar="N"
    )
    parser.add_argument(
        "--outage-failure-rate", type=float, default=defaults.outage_failure_rate, metavar="R"
    )
    parser.add_argument(
        "--outage-gap",
        type=float,
        default=defaults.outage_gap_ms / 1000,
        metavar="SECONDS",
        help="failures further apart than this start a new run (outage detection; "
        "default %(default)g)",
    )
    parser.add_argument(
        "--poison-min-failures", type=int, default=defaults.poison_min_failures, metavar="N"
    )
    parser.add_argument(
        "--poison-min-messages", type=int, default=defaults.poison_min_messages, metavar="N"
    )
    return parser


def options_from(args: argparse.Namespace) -> JobOptions:
    if args.window <= 0:
        raise AnalyzeError("--window must be positive")
    if args.outage_gap <= 0:
        raise AnalyzeError("--outage-gap must be positive")
    return JobOptions(
        events=args.events,
        out=args.out,
        master=args.master,
        driver_memory=args.driver_memory,
        settings=TriageSettings(
            window_ms=int(args.window * 1000),
            transient_conditions=tuple(
                c.strip() for c in args.transient_conditions.split(",") if c.strip()
            ),
            outage_min_failures=args.outage_min_failures,
            outage_failure_rate=args.outage_failure_rate,
            outage_gap_ms=int(args.outage_gap * 1000),
            poison_min_failures=args.poison_min_failures,
            poison_min_messages=args.poison_min_messages,
        ),
    )


def check_input(options: JobOptions) -> None:
    """Fail before Spark starts, with one line, on input that cannot work."""
    events = options.events
    if not events.exists():
        raise AnalyzeError(f"events directory {events} does not exist")
    if not events.is_dir():
        raise AnalyzeError(f"{events} is not a directory")
    if not ingest.event_files(events):
        parts = any(events.glob("*.jsonl.part"))
        hint = " (only .part files: the broker renames them on rotation or shutdown)"
        raise AnalyzeError(
            f"no event files (*.jsonl, *.jsonl.gz) in {events}{hint if parts else ''}"
        )
    if options.out.exists() and not options.out.is_dir():
        raise AnalyzeError(f"--out {options.out} exists and is not a directory")
    try:  # here, not after Spark's start (user pass: a traceback after tens of seconds)
        options.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AnalyzeError(f"cannot create --out {options.out}: {e.strerror}") from None


def _is_local(master: str) -> bool:
    if master.startswith("local"):
        return True
    host = urllib.parse.urlsplit(master).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def build_session(
    master: str | None,
    *,
    driver_memory: str = "4g",
    java_options: str = "",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A session for this job. Under spark-submit (a gateway is already running) and
    without `--master`, spark-submit's settings win; on this machine the driver, the
    workers and the Python workers are pinned to loopback and to this interpreter.
    `java_options` go to a driver JVM this call launches (tests: a quicker JIT); `conf`
    to the session's SparkConf, where `configure` leaves a setting it finds (tests: fewer
    shuffle partitions)."""
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    chosen = master or (None if submitted else DEFAULT_MASTER)
    builder = SparkSession.builder.appName("amqpbroker-analyze")
    if chosen is not None:
        builder = builder.master(chosen)
    if chosen is not None and _is_local(chosen):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
        )
        if not submitted:  # we launch the driver JVM: its heap, GC and logging are ours
            log4j = Path(__file__).with_name("log4j2.properties").resolve().as_uri()
            builder = builder.config("spark.driver.memory", driver_memory).config(
                "spark.driver.extraJavaOptions",
                # Throughput GC: a batch job, no latency to protect.
                f"-XX:+UseParallelGC -Dlog4j2.configurationFile={log4j} {java_options}".strip(),
            )
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # Java missing, master unreachable: one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = chosen or "from spark-submit"
        raise AnalyzeError(f"cannot start Spark (master {where}): {first}") from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def configure(spark: SparkSession) -> None:
    """Session settings the job's results depend on (also on a caller's session)."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # dates and windows in UTC
    # Partitioned writes without a sort while a task has at most 16 dates open.
    spark.conf.set("spark.sql.maxConcurrentOutputFileWriters", "16")
    # The tables are small aggregates: Spark's 200 shuffle partitions cost a task each
    # (seconds per stage on a small cluster). Unless the user set it, scale to the cores.
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        cores = spark.sparkContext.defaultParallelism
        spark.conf.set("spark.sql.shuffle.partitions", str(max(8, 4 * cores)))
    # The store lookups (state.acks_near, acks_of_keys) filter by a few hundred keys at
    # most: pushed down to Parquet as such, not as a min..max range (default: 10 values).
    spark.conf.set("spark.sql.parquet.pushdown.inFilterThreshold", "1000")


def _rows(df: DataFrame, *order: str) -> list[dict[str, Any]]:
    """Collect a small table, sorted here (a Spark sort would be one more job), in one
    task (as `_Tables.save`); the rows come in the same order."""
    rows = [row.asDict(recursive=True) for row in df.coalesce(1).collect()]
    return sorted(rows, key=lambda r: tuple((r[k] is None, r[k]) for k in order))


class _Tables:
    """Writes the (small) tables under `out/tables/` and keeps them cached, so the
    report collects them without computing them again."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.cached: list[DataFrame] = []

    def save(self, name: str, df: DataFrame) -> DataFrame:
        # Cached as the one partition written: what reads it (the report's collects, the
        # tables made from it) then runs a task, not one per shuffle partition, ~0.05 CPU-s
        # each for tables of a few rows (docs/decisions.md, "The long tier").
        df = df.coalesce(1).cache()
        self.cached.append(df)
        df.write.mode("overwrite").parquet(str((self.out / "tables" / name).resolve()))
        return df

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()


def run(options: JobOptions, spark: SparkSession, *, stream: TextIO = sys.stderr) -> report.Results:
    """The whole job on `spark`; returns what it reported.

    Raises:
        AnalyzeError: bad input (CONTRACT: exit 1): `--out` made from another events
            directory, or no valid event at all.
    """
    started = time.monotonic()
    check_input(options)
    settings = options.settings
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    configure(spark)
    store = ingest.Store(out)
    try:
        ingest.claim(store, options.events)
    except ValueError as e:
        raise AnalyzeError(str(e)) from None
    progress = Progress(spark.sparkContext, total_steps=STEPS, stream=stream)
    saved = _Tables(out)
    save = saved.save

    with progress.step("compacting new event files into Parquet"):
        open_files = [report.OpenFile.of(p) for p in ingest.open_files(options.events)]
        listed = ingest.event_files(options.events)  # availableNow reads at least these
        new_lines = ingest.compact(spark, options.events, store)
    try:
        ingest.mark_compacted(options.events, listed)
    except OSError as e:  # a read-only events directory: keep-until-analyzed cannot know
        stream.write(f"warning: cannot record the compacted files in {options.events}: {e}\n")
    stored = ingest.stored_events(spark, store)
    with progress.step("new events: counters, failures, acks"):
        update = state.update(spark, store.state, stored, settings.window_ms)
        partials = update.state
        state.clear_stale(store.state, partials)
        files_df = partials.read(spark, "files")
        files = [r.asDict() for r in files_df.collect()] if files_df is not None else []
        total, malformed, first_ts, last_ts = ingest.overview(files)
        if total == 0:
            raise AnalyzeError(
                f"no valid event in {options.events} ({malformed:,} malformed lines): "
                "nothing to analyze"
            )

    def partial(name: str) -> DataFrame:
        df = partials.read(spark, name)
        assert df is not None  # some file had a valid event
        return df

    with progress.step("per-queue counters, attempts"):
        counts = partial("counts").cache()
        saved.cached.append(counts)
        per_window = tables.queue_windows(counts)
        windows = save("queue_windows", per_window)
        # From the windows as computed (not the one cached partition): the rows of
        # queue_totals are written in the same order whatever `save` caches.
        totals = save("queue_totals", tables.queue_totals(per_window))
        outcomes = save("queue_outcomes", tables.queue_outcomes(counts))
        attempts = save("attempts", tables.attempt_distribution(counts))
    with progress.step("time to dead-letter"):
        triage = partial("triage").cache()
        saved.cached.append(triage)
        dead = tables.dead_letters(triage).cache()
        saved.cached.append(dead)
        ttd = save("time_to_dead_letter", tables.time_to_dead_letter(dead))
        histogram = save(
            "time_to_dead_letter_histogram", tables.time_to_dead_letter_histogram(dead)
        )
    with progress.step("errors, outages and poison candidates"):
        failed = tables.failures(triage).cache()
        saved.cached.append(failed)
        errors = save("errors", tables.top_errors(tables.error_counts(failed), settings.top_errors))
        acked = partial("ack_seconds").cache()
        saved.cached.append(acked)
        runs = tables.failure_runs(failed, acked, settings).cache()
        saved.cached.append(runs)
        outages = save(
            "outages",
            tables.outages(runs, state.acks_near(stored, runs, acked, settings), settings),
        )
        suspects = tables.poison_suspects(failed, settings).cache()
        saved.cached.append(suspects)
        acks_of_suspects = state.acks_of_keys(stored, suspects)
        poison = save(
            "poison", tables.poison_candidates(failed, acks_of_suspects, settings, suspects)
        )
        per_queue = save("queue_failures", tables.queue_failures(failed, partial("dispatches")))
        hashed = failed.agg(
            F.count(F.lit(1)).alias("failures"),
            F.count("body_hash").alias("hashed"),
        ).first()
    with progress.step("redrive candidates"):
        copies = tables.still_queued_copies(dead, partial("removed"), report.last_starts(files))
        outage_msgs = tables.outage_messages(runs, outages)
        classified = save(
            "dead_letters", tables.classify_dead_letters(copies, outage_msgs, poison, settings)
        )
        redrive = save("redrive", tables.redrive_candidates(classified))
        groups = classified.groupBy("queue", "basis", "held_back").agg(
            F.count(F.lit(1)).alias("messages"),
            F.array_sort(F.collect_set("original_address")).alias("original_addresses"),
            F.array_sort(F.collect_set("error_condition")).alias("error_conditions"),
            F.array_sort(F.array_distinct(F.flatten(F.collect_list("also_in")))).alias("also_in"),
            F.min("dead_lettered_ts").alias("first_ms"),
            F.max("dead_lettered_ts").alias("last_ms"),
        )
    with progress.step("writing report.html, summary.json, redrive.jsonl"):
        # The report's sample is the first 50 of the rows written, not a `limit` of its
        # own: that was 1-3 more Spark jobs per run (docs/decisions.md, "The long tier").
        redrive_sample: list[dict[str, Any]] = []

        def redrive_rows() -> Iterator[dict[str, Any]]:
            for row in redrive.orderBy("queue", "msg_id").toLocalIterator():
                if len(redrive_sample) < report.REDRIVE_SAMPLE:
                    redrive_sample.append(row.asDict(recursive=True))
                yield row.asDict()

        redrive_count = report.write_redrive(out / "redrive.jsonl", redrive_rows())
        assert hashed is not None
        results = report.Results(
            events=total,
            malformed_lines=malformed,
            first_ts=first_ts,
            last_ts=last_ts,
            new_lines=new_lines,
            window_ms=settings.window_ms,
            queue_totals=_rows(totals, "queue"),
            queue_windows=_rows(
                windows.select(
                    "queue",
                    F.unix_millis("window_start").alias("window_start_ms"),
                    "failure_rate",
                ),
                "queue",
                "window_start_ms",
            ),
            outcomes=_rows(outcomes),
            attempts=_rows(attempts),
            time_to_dead_letter=_rows(ttd, "queue"),
            histogram=_rows(histogram, "from_ms"),
            errors=_rows(errors, "queue", "rank"),
            poison=sorted(_rows(poison, "key_type", "key"), key=lambda r: -int(r["failures"])),
            redrive_count=redrive_count,
            redrive_sample=redrive_sample,
            outages=_rows(outages.where("failing"), "queue", "start_ms"),
            queue_failures=_rows(per_queue, "queue"),
            redrive_groups=_rows(groups, "queue", "basis", "held_back"),
            files=files,
            open_files=open_files,
            failures=int(hashed["failures"]),
            hashed_failures=int(hashed["hashed"]),
            settings=settings,
            events_dir=str(options.events),
            out_dir=str(out),
        )
        saved.release()
        (out / "summary.json").write_text(json.dumps(report.summary(results), indent=2) + "\n")
        results.seconds = time.monotonic() - started
        (out / "report.html").write_text(report.render_html(results), encoding="utf-8")
    return results


def main(argv: list[str] | None = None, *, prog: str | None = None) -> int:
    """Command-line entry (also spark-submit's). Exit 0, 1 on bad input, 2 on bad usage."""
    name = prog or "amqpbroker analyze"
    args = build_parser(prog).parse_args(argv)
    try:
        options = options_from(args)
        check_input(options)
        started = time.monotonic()
        spark = build_session(options.master, driver_memory=options.driver_memory)
        try:
            results = run(options, spark)
        finally:
            spark.stop()
        results.seconds = time.monotonic() - started
        sys.stdout.write(report.terminal_summary(results, options.out) + "\n")
    except AnalyzeError as e:
        sys.stderr.write(f"{name}: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="job.py"))
