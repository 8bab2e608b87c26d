"""The whole job: increments, restarts, bad input (the synthetic log with planted poison
and an outage: test_incremental.py, whose run over the whole log serves both)."""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from pyspark.sql import SparkSession

from amqpbroker.analytics.ingest import COMPACTED_MARKER, Store, stored_events
from amqpbroker.analytics.job import AnalyzeError, JobOptions, main, run
from amqpbroker.analytics.report import Results, terminal_summary
from amqpbroker.analytics.state import PARTIALS, State
from amqpbroker.analytics.tables import TriageSettings

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


class Analyzed(NamedTuple):
    events: Path
    out: Path
    results: Results
    summary: dict[str, Any]  # summary.json as this run wrote it
    html: str  # report.html as this run wrote it


LINE = (
    '{{"ts":{ts},"seq":{seq},"event":"{event}","broker":"b","msg_id":{msg},'
    '"amqp_message_id":null,"address":"q","queue":{queue},"routing_type":null,'
    '"durable":false,"size":1,"delivery_count":0,"connection":null,"link":null,"txn":null,'
    '"reason":null,"target_address":null,"target_queues":null,"copy_msg_id":null,'
    '"delay_ms":null,"first_ts":{ts},"error_condition":null,"error_description":null,'
    '"props":null,"body_hash":null}}\n'
)


def lines(*events: tuple[int, str]) -> str:
    return "".join(
        LINE.format(ts=1_767_225_600_000 + s, seq=s, event=e, msg=s, queue='"q"' if s else "null")
        for s, e in events
    )


def test_compacted_marker_name_is_the_brokers() -> None:
    """Issue 17: the broker (eventlog/retention.py) and analyze (ingest) name the marker alike
    (analytics imports no broker module, so the name is written twice)."""
    from amqpbroker.eventlog.retention import COMPACTED_MARKER as BROKERS

    assert BROKERS == COMPACTED_MARKER


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "events directory {d} does not exist"),
        (lambda d: d.mkdir(), "no event files (*.jsonl, *.jsonl.gz) in {d}"),
        (
            lambda d: (d.mkdir(), (d / "events-1.jsonl.part").write_text("{}\n")),
            "no event files (*.jsonl, *.jsonl.gz) in {d} (only .part files: the broker "
            "renames them on rotation or shutdown)",
        ),
    ],
    ids=["missing", "empty", "only-part-files"],
)
def test_missing_or_empty_directory_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: object, message: str
) -> None:
    """CONTRACT: exit 1 with a one-line error, before Spark starts."""
    directory = tmp_path / "events"
    setup(directory)  # type: ignore[operator]
    code = main(["--events", str(directory), "--out", str(tmp_path / "out")])
    assert code == 1
    assert capsys.readouterr().err == f"amqpbroker analyze: {message.format(d=directory)}\n"
    assert not (tmp_path / "out").exists()


def test_an_out_directory_that_cannot_be_made_is_a_one_line_error_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """User pass (session 9): `--out` below a file was a traceback from `mkdir` once Spark
    had started."""
    events = tmp_path / "events"
    events.mkdir()
    (events / "events-1.jsonl").write_text("{}\n")
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "report"
    assert main(["--events", str(events), "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"amqpbroker analyze: cannot create --out {out}: {os.strerror(errno.ENOTDIR)}\n"
    )


def amqpbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amqpbroker", *args], capture_output=True, text=True, timeout=30
    )


def test_cli_analyze_forwards_to_the_job(tmp_path: Path) -> None:
    """CONTRACT "Command line": --help 0, bad input 1 (one line), bad usage 2."""
    assert "--transient-conditions" in amqpbroker("analyze", "--help").stdout
    missing = amqpbroker("analyze", "--events", str(tmp_path / "x"), "--out", str(tmp_path))
    assert (missing.returncode, missing.stderr) == (
        1,
        f"amqpbroker analyze: events directory {tmp_path / 'x'} does not exist\n",
    )
    assert amqpbroker("analyze", "--events", str(tmp_path)).returncode == 2


def test_the_broker_never_imports_pyspark() -> None:
    """STYLE section 2: only `amqpbroker analyze` loads the analytics package."""
    code = (
        "import sys, amqpbroker.cli, amqpbroker.server; amqpbroker.cli.build_parser(); "
        "sys.exit(any(m.split('.')[0] in ('pyspark', 'py4j') or m.startswith("
        "'amqpbroker.analytics') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0


def seq_lines(*events: tuple[int, int, str]) -> str:
    """(ts offset, seq, event) lines of queue q, msg_id = ts offset."""
    return "".join(
        LINE.format(ts=1_767_225_600_000 + t, seq=s, event=e, msg=t, queue='"q"')
        for t, s, e in events
    )


@pytest.fixture(scope="module")
def restarted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Analyzed:
    """One run over a log with a restart, a seq gap, a JSON array line, a gzipped file and
    a `.part` file: a run costs seconds of Spark, so it is also the first of the two runs
    of `test_a_second_run_reads_only_new_files_plain_or_gzipped_and_marks_them_compacted`
    (which adds files to `events` and runs again into `out`). What that second run
    rewrites, summary.json and report.html, is kept here as the first run wrote it; the
    other tests read only what a second run leaves true."""
    events, out = tmp_path_factory.mktemp("restarted") / "events", tmp_path_factory.mktemp("out")
    events.mkdir()
    (events / "events-1.jsonl").write_text(seq_lines((1, 1, "enqueued"), (2, 2, "acked")))
    (events / "events-2.jsonl.gz").write_bytes(
        gzip.compress(seq_lines((3, 3, "enqueued"), (9, 7, "acked")).encode())
    )
    restart = seq_lines((20, 1, "enqueued"), (21, 2, "acked"))
    array = "[" + ",".join(restart.splitlines()) + "]\n"
    (events / "events-3.jsonl").write_text(restart + array)
    (events / "events-4.jsonl.part").write_text(seq_lines((30, 3, "enqueued")))
    results = run(JobOptions(events=events, out=out), spark, stream=io.StringIO())
    summary = json.loads((out / "summary.json").read_text())
    return Analyzed(events, out, results, summary, (out / "report.html").read_text())


def test_restarts_seq_gaps_and_the_open_file_are_reported(restarted: Analyzed) -> None:
    """Issue 22 items 2 and 6 (B-170): `seq` starting again at 1 is a restart, a gap in
    `seq` is dropped events; the `.part` file (the incident in progress) is named with
    its size, never skipped without a word; a JSON array on one line is one malformed
    line, not several events. All on stdout too."""
    out = restarted.out
    stdout = terminal_summary(restarted.results, out)  # what `main` prints
    summary = restarted.summary
    assert (summary["events"], summary["malformed_lines"]) == (6, 1)
    assert "WARNING: the broker restarted 1 time(s) (at 2026-01-01 00:00:00Z)" in stdout
    assert "WARNING: 3 event(s) missing (seq gaps" in stdout
    assert "WARNING: NOT ANALYZED: events-4.jsonl.part is still being written (1 lines" in stdout
    html = restarted.html
    assert "events-4.jsonl.part" in html
    assert "restarted 1 time" in html


def test_a_second_run_reads_only_new_files_plain_or_gzipped_and_marks_them_compacted(
    spark: SparkSession, restarted: Analyzed
) -> None:
    """Issue 17: the broker gzips rotated files (`.jsonl.gz`); analyze reads them with the
    plain ones, each once, and records every file it compacted in `.compacted.json` (what
    `event-log.keep-until-analyzed` reads), keeping earlier names of files still there.
    Incremental compaction: seen files are skipped, .part files are never read; the
    partials of the tables are computed for the new files only and merged with the first
    run's (issue 22 item 8). The first run is the `restarted` fixture's (each run costs
    seconds of Spark)."""
    events, out, first = restarted.events, restarted.out, restarted.results
    assert (first.new_lines, first.events) == (7, 6)
    marker = json.loads((events / COMPACTED_MARKER).read_text())
    assert marker == {"files": ["events-1.jsonl", "events-2.jsonl.gz", "events-3.jsonl"]}
    (events / "events-1.jsonl").unlink()  # retention deleted it
    (events / "events-5.jsonl.gz").write_bytes(gzip.compress(seq_lines((40, 3, "acked")).encode()))
    (events / "events-6.jsonl").write_text(
        seq_lines((41, 4, "enqueued"), (42, 5, "acked")) + "{oops\n"
    )
    second = run(JobOptions(events=events, out=out), spark, stream=io.StringIO())
    assert (second.new_lines, second.events, second.malformed_lines) == (4, 9, 2)
    summary = json.loads((out / "summary.json").read_text())
    # 1, 3, 20 and 41 (not the .part file's 30); 2, 9, 21, 40 and 42: each file counted
    # once, the JSON array line of the first run never.
    assert (summary["queues"]["q"]["enqueued"], summary["queues"]["q"]["acked"]) == (4, 5)
    marker = json.loads((events / COMPACTED_MARKER).read_text())
    assert marker == {
        "files": ["events-2.jsonl.gz", "events-3.jsonl", "events-5.jsonl.gz", "events-6.jsonl"]
    }
    assert list((out / "events").glob("date=2026-01-01"))
    # Issue 22 item 8: the second run derived its partials from the new files only; the
    # sums above are the first run's merged with them (what a full recount gives).
    state = json.loads((out / "_state" / "state.json").read_text())
    assert (state["files"], state["runs"]) == (
        [
            "events-1.jsonl",
            "events-2.jsonl.gz",
            "events-3.jsonl",
            "events-5.jsonl.gz",
            "events-6.jsonl",
        ],
        ["run-1", "run-2"],
    )
    run2 = spark.read.parquet(str(out / "_state" / "run-2" / "files")).collect()
    assert sorted((r.file, r.valid, r.malformed) for r in run2) == [
        ("events-5.jsonl.gz", 1, 0),
        ("events-6.jsonl", 2, 1),
    ]


def test_an_out_directory_of_another_event_log_is_refused(
    spark: SparkSession, restarted: Analyzed, tmp_path: Path
) -> None:
    """Issue 22 item 6: one --out holds one event log; reusing it for another directory
    would merge two logs: refused (exit 1 from the command line)."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "events-1.jsonl").write_text(lines((1, "enqueued")))
    out = restarted.out
    stored = sorted((out / "events").rglob("*.parquet"))
    assert stored
    with pytest.raises(AnalyzeError, match=r"holds the events of .*/events, not .*/other"):
        run(JobOptions(events=other, out=out), spark, stream=io.StringIO())
    assert sorted((out / "events").rglob("*.parquet")) == stored  # nothing merged


def test_a_log_without_one_valid_event_is_bad_input(spark: SparkSession, tmp_path: Path) -> None:
    """Issue 22 item 6, CONTRACT: a run that read no valid event is an error (exit 1),
    not an empty report."""
    events = tmp_path / "events"
    events.mkdir()
    (events / "events-1.jsonl").write_text('{oops\n[{"ts": 1}]\n')
    with pytest.raises(AnalyzeError, match=r"no valid event in .* \(2 malformed lines\)"):
        run(JobOptions(events=events, out=tmp_path / "out"), spark, stream=io.StringIO())


def test_the_store_and_the_partials_are_read_without_a_spark_job(
    spark: SparkSession, restarted: Analyzed
) -> None:
    """Suite time (docs/decisions.md, "The long tier"): each read of the store or of a
    partial that infers its schema runs a Spark job (a Parquet footer read), 7 or 8 per
    run. The store's schema is fixed and the partials' are recorded in state.json as
    written, and they are what inference gives."""
    tracker = spark.sparkContext.statusTracker()
    store = Store(restarted.out)
    state = State.load(store.state, TriageSettings().window_ms)
    assert {name for name, _ in state.schemas} == set(PARTIALS)
    before = max(tracker.getJobIdsForGroup(None), default=-1)
    given = {name: state.read(spark, name) for name in PARTIALS}
    stored = stored_events(spark, store)
    assert max(tracker.getJobIdsForGroup(None), default=-1) == before
    assert stored.schema == spark.read.parquet(str(store.events)).schema
    inferred = State(state.root, runs=state.runs, window_ms=state.window_ms)
    for name, df in given.items():
        assert df is not None
        read = inferred.read(spark, name)
        assert read is not None
        assert df.schema == read.schema, name
