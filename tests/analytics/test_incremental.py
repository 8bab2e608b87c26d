"""Incremental runs (issue 22 item 8): a run that adds files to a report directory gives
exactly what one run over all the files gives: every table, summary.json, the redrive
lists. The log is split where per-message state crosses runs: a dead letter whose last
dispatch (the consumer named in queue_failures) is in the previous run's file, and a DLQ
copy consumed in the next file (no longer redrivable).

The run over the whole log is also where the job is checked against what the generator
planted (poison, the outage's redrive list): one run of it serves both (a run costs tens
of seconds of Spark on two cores)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import NamedTuple

import pytest
from pyspark.sql import SparkSession
from support.synth_events import Planted, generate

from amqpbroker.analytics.job import JobOptions, run
from amqpbroker.analytics.report import Results
from amqpbroker.analytics.tables import TriageSettings

# Three whole runs and 24 table reads in one test (~115 s on a quiet machine): 240 s timed
# out at load 21, and a timeout that interrupts a py4j call leaves the worker's session
# unusable for every analytics test after it. Five times the quiet figure.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def _event(line: str) -> dict[str, object]:
    try:
        parsed = json.loads(line)
    except ValueError:  # the planted malformed lines
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _split_points(lines: list[str]) -> tuple[int, int]:
    """(after the last dispatch of a max-attempts dead letter, before its dead letter;
    between a dead letter and the ack of its copy in the DLQ)."""
    events = [_event(line) for line in lines]
    for i, e in enumerate(events):
        if e.get("event") == "dead-lettered" and e.get("reason") == "max-attempts":
            copy = e["copy_msg_id"]
            acked = [
                j
                for j in range(i, min(i + 4, len(events)))
                if events[j].get("msg_id") == copy and events[j].get("event") == "acked"
            ]
            if acked:
                dispatch = max(
                    j
                    for j in range(i)
                    if events[j].get("msg_id") == e["msg_id"]
                    and events[j].get("event") == "dispatched"
                )
                return dispatch + 1, acked[0]
    raise AssertionError("no DLQ copy acked in the synthetic log")


def _outputs(out: Path, spark: SparkSession) -> dict[str, object]:
    got: dict[str, object] = {
        "summary.json": json.loads((out / "summary.json").read_text()),
        "redrive.jsonl": (out / "redrive.jsonl").read_text().splitlines(),
    }
    for path in sorted((out / "redrive").iterdir()):
        got[f"redrive/{path.name}"] = path.read_text().splitlines()
    for table in sorted((out / "tables").iterdir()):
        rows = spark.read.parquet(str(table)).collect()
        got[f"tables/{table.name}"] = sorted(repr(r.asDict(recursive=True)) for r in rows)
    return got


class Whole(NamedTuple):
    """The log cut into three files at the split points, and one run over all three."""

    planted: Planted
    parts: list[list[str]]
    out: Path
    results: Results


@pytest.fixture(scope="module")
def whole(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Whole:
    tmp = tmp_path_factory.mktemp("incremental")
    source = tmp / "source"
    planted = generate(source, events=6_000, file_events=1_000_000)
    [log] = list(source.iterdir())
    lines = log.read_text().splitlines(keepends=True)
    first, second = _split_points(lines)
    assert 0 < first < second < len(lines)
    parts = [lines[:first], lines[first:second], lines[second:]]
    events = tmp / "whole"
    events.mkdir()
    for n, part in enumerate(parts):
        (events / f"events-{n}.jsonl").write_text("".join(part))
    out = tmp / "out-whole"
    settings = TriageSettings(window_ms=planted.window_ms)
    results = run(
        JobOptions(events=events, out=out, settings=settings), spark, stream=io.StringIO()
    )
    return Whole(planted, parts, out, results)


def test_finds_all_planted_poison_and_exactly_the_outage_messages(whole: Whole) -> None:
    """Poison payloads fail on 3 messages each; outage victims still in the DLQ are the
    redrive list, minus those already consumed from the DLQ and the poison one."""
    planted, out = whole.planted, whole.out
    assert planted.redrive
    redrive = map(json.loads, (out / "redrive.jsonl").read_text().splitlines())
    assert {(row["msg_id"], row["queue"]) for row in redrive} == planted.redrive
    poison = {(row["key_type"], row["key"]) for row in whole.results.poison}
    assert poison == {("body_hash", h) for h in planted.poison_body_hashes}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == planted.events
    assert summary["malformed_lines"] == planted.malformed_lines
    assert summary["poison_candidates"] == len(planted.poison_body_hashes)
    assert summary["redrive_candidates"] == len(planted.redrive)
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 3
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    tables = {p.name for p in (out / "tables").iterdir()}
    assert {"queue_windows", "queue_totals", "attempts", "poison", "redrive"} <= tables


@pytest.mark.long  # ~75 s of Spark (three runs, 48 table reads): `make test-long`, in CI
def test_an_incremental_run_equals_a_run_from_scratch(
    spark: SparkSession, whole: Whole, tmp_path: Path
) -> None:
    """Issue 22 item 8: three files analyzed in one run, and the same three files analyzed
    one run each into another report directory, give the same outputs."""
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    settings = TriageSettings(window_ms=whole.planted.window_ms)
    for n, part in enumerate(whole.parts):
        (pieces / f"events-{n}.jsonl").write_text("".join(part))
        result = run(
            JobOptions(events=pieces, out=tmp_path / "out-pieces", settings=settings),
            spark,
            stream=io.StringIO(),
        )
        assert result.new_lines == len(part)

    expected = _outputs(whole.out, spark)
    got = _outputs(tmp_path / "out-pieces", spark)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == expected[name], name
    summary = expected["summary.json"]
    assert isinstance(summary, dict)
    assert summary["redrive_candidates"] == len(whole.planted.redrive)
    state = json.loads((tmp_path / "out-pieces" / "_state" / "state.json").read_text())
    assert state["runs"] == ["run-1", "run-2", "run-3"]
