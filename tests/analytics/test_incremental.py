"""Incremental runs (issue 22 item 8): a run that adds files to a report directory gives
exactly what one run over all the files gives: every table, summary.json, the redrive
lists. The log is split where per-message state crosses runs: a dead letter whose last
dispatch (the consumer named in queue_failures) is in the previous run's file, and a DLQ
copy consumed in the next file (no longer redrivable)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from support.synth_events import generate

from amqpbroker.analytics.job import JobOptions, run
from amqpbroker.analytics.tables import TriageSettings

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


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


def test_an_incremental_run_equals_a_run_from_scratch(spark: SparkSession, tmp_path: Path) -> None:
    """Issue 22 item 8: three files analyzed in one run, and the same three files analyzed
    one run each into another report directory, give the same outputs."""
    source = tmp_path / "source"
    planted = generate(source, events=6_000, file_events=1_000_000)
    [log] = list(source.iterdir())
    lines = log.read_text().splitlines(keepends=True)
    first, second = _split_points(lines)
    assert 0 < first < second < len(lines)
    parts = [lines[:first], lines[first:second], lines[second:]]
    settings = TriageSettings(window_ms=planted.window_ms)

    whole, pieces = tmp_path / "whole", tmp_path / "pieces"
    whole.mkdir()
    pieces.mkdir()
    for n, part in enumerate(parts):
        (whole / f"events-{n}.jsonl").write_text("".join(part))
    run(
        JobOptions(events=whole, out=tmp_path / "out-whole", settings=settings),
        spark,
        stream=io.StringIO(),
    )

    for n, part in enumerate(parts):
        (pieces / f"events-{n}.jsonl").write_text("".join(part))
        result = run(
            JobOptions(events=pieces, out=tmp_path / "out-pieces", settings=settings),
            spark,
            stream=io.StringIO(),
        )
        assert result.new_lines == len(part)

    expected = _outputs(tmp_path / "out-whole", spark)
    got = _outputs(tmp_path / "out-pieces", spark)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == expected[name], name
    summary = expected["summary.json"]
    assert isinstance(summary, dict)
    assert summary["redrive_candidates"] == len(planted.redrive)
    state = json.loads((tmp_path / "out-pieces" / "_state" / "state.json").read_text())
    assert state["runs"] == ["run-1", "run-2", "run-3"]
