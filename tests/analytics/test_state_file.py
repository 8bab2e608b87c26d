"""Third attack pass: the files `analyze` reads back from `--out` and the events
directory (`_state/state.json`, `source.json`, `.compacted.json`) may have been altered:
whatever they hold, `analyze` starts over or goes on, and never acts on a path they name.
No Spark session: these are read before any Spark work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from amqpbroker.analytics.ingest import COMPACTED_MARKER, Store, claim, mark_compacted
from amqpbroker.analytics.state import VERSION, State

SCHEMA = json.dumps({"type": "struct", "fields": []})


def _state(root: Path, **fields: Any) -> None:
    root.mkdir(parents=True, exist_ok=True)
    body = {"version": VERSION, "window_ms": 1000, "files": [], "runs": [], "schemas": {}}
    (root / "state.json").write_text(json.dumps({**body, **fields}))


def test_a_sound_state_is_read(tmp_path: Path) -> None:
    (tmp_path / "run-3").mkdir()
    _state(tmp_path, files=["a"], runs=["run-3"], schemas={"files": SCHEMA})
    state = State.load(tmp_path, 1000)
    assert (state.files, state.runs, state.schemas) == (("a",), ("run-3",), (("files", SCHEMA),))
    assert state.next_run() == "run-4"


@pytest.mark.parametrize(
    "fields",
    [
        {"runs": ["../victim"]},  # a fold would rmtree it
        {"runs": ["run-x"]},  # next_run: ValueError
        {"runs": "run-1"},
        {"runs": 5},  # TypeError
        {"files": 5},
        {"files": [["a"]]},
        {"schemas": {"files": "not json"}},  # read: ValueError
        {"schemas": {"files": "{}"}},  # read: KeyError
        {"schemas": []},
    ],
)
def test_an_altered_state_is_started_over(tmp_path: Path, fields: dict[str, Any]) -> None:
    """Each of these raised in `update`/`fold`, or (`../victim`, a directory) made the
    fold after 16 runs delete a directory outside `_state`: now an empty state (a
    rebuild from the store, as for a state of another version)."""
    root = tmp_path / "_state"
    (tmp_path / "victim").mkdir()
    (root / "run-1").mkdir(parents=True)
    (root / "run-x").mkdir()
    _state(root, **fields)
    state = State.load(root, 1000)
    assert (state.files, state.runs, state.schemas) == ((), (), ())


def test_a_state_nested_deep_is_started_over(tmp_path: Path) -> None:
    tmp_path.joinpath("state.json").write_text("[" * 200_000)
    assert State.load(tmp_path, 1000).runs == ()


def test_markers_nested_deep_or_mistyped_are_no_markers(tmp_path: Path) -> None:
    """`source.json` and `.compacted.json` nested deep raised RecursionError, a marker
    whose `files` is a number TypeError: now they read as absent."""
    events = tmp_path / "events"
    events.mkdir()
    (events / "events-1.jsonl").write_text("")
    out = tmp_path / "out"
    out.mkdir()
    (out / "source.json").write_text("[" * 200_000)
    claim(Store(out), events)  # no compacted events yet: claimed anew
    assert json.loads((out / "source.json").read_text())["events"] == str(events.resolve())
    for text in ("[" * 200_000, json.dumps({"files": 5})):
        (events / COMPACTED_MARKER).write_text(text)
        mark_compacted(events, ["events-1.jsonl"])
        assert json.loads((events / COMPACTED_MARKER).read_text()) == {"files": ["events-1.jsonl"]}
