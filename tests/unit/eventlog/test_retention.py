"""The event log's disk budget (issue 17; B-170 drops): retention by size and age, files
`analyze` has not compacted, gzip of rotated files, and the free-space floor.

`decide_retention` is tested as a pure function; the writer process through the real
`EventLogWriter` with tiny limits, and in-process (`ChildWriter`) with an injected
`statvfs` for the floor.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import pytest
from support.event_files import PatientWriter, finished_files, read_events

from amqpbroker.config import EventLogConfig
from amqpbroker.core import LifecycleEvent, RawEvent
from amqpbroker.eventlog import EventLogWriter
from amqpbroker.eventlog.child import ChildWriter
from amqpbroker.eventlog.retention import (
    COMPACTED_MARKER,
    EventFile,
    RetentionLimits,
    auto_limit,
    decide_retention,
)

DAY_MS = 86_400_000
NOW_MS = 1_800_000_000_000


def f(
    name: str, size: int, age_ms: int = 0, *, finished: bool = True, compacted: bool = False
) -> EventFile:
    return EventFile(name, size, NOW_MS - age_ms, finished, compacted)


def names(files: list[EventFile]) -> list[str]:
    return [x.name for x in files]


# -- the decision ------------------------------------------------------------------------


def test_oldest_files_go_first_while_over_max_total_bytes() -> None:
    files = [f("c", 100, 1), f("a", 100, 3), f("b", 100, 2), f("d", 100, 0)]
    doomed = decide_retention(files, RetentionLimits(max_total_bytes=250), now_ms=NOW_MS)
    assert names(doomed) == ["a", "b"]  # 400 -> 200: the two oldest by last write


def test_files_older_than_max_age_go_whatever_the_total() -> None:
    files = [f("a", 1, 8 * DAY_MS), f("b", 1, 7 * DAY_MS + 1), f("c", 1, 7 * DAY_MS)]
    doomed = decide_retention(files, RetentionLimits(max_age_ms=7 * DAY_MS), now_ms=NOW_MS)
    assert names(doomed) == ["a", "b"]  # exactly max-age old stays


def test_part_files_are_never_deleted_but_count_toward_the_total() -> None:
    """The open `.part` (or one a dead writer left) is never deleted; its bytes push
    finished files out instead."""
    files = [f("old.part", 500, 9 * DAY_MS, finished=False), f("a", 100, 2), f("b", 100, 1)]
    limits = RetentionLimits(max_total_bytes=600, max_age_ms=DAY_MS)
    assert names(decide_retention(files, limits, now_ms=NOW_MS)) == ["a"]


def test_keep_until_analyzed_protects_files_analyze_has_not_compacted() -> None:
    files = [f("a", 100, 3), f("b", 100, 2, compacted=True), f("c", 100, 1)]
    limits = RetentionLimits(max_total_bytes=0, max_age_ms=0, keep_until_analyzed=True)
    assert names(decide_retention(files, limits, now_ms=NOW_MS)) == ["b"]
    unprotected = RetentionLimits(max_total_bytes=0, max_age_ms=0)
    assert names(decide_retention(files, unprotected, now_ms=NOW_MS)) == ["a", "b", "c"]


def test_no_limits_delete_nothing() -> None:
    files = [f("a", 10**12, 10**12)]
    assert decide_retention(files, RetentionLimits(), now_ms=NOW_MS) == []


@pytest.mark.parametrize(
    ("configured", "fs_bytes", "expected"),
    [
        (None, 10 * 2**30, 2**30),  # 10% of a 10 GiB disk
        (None, 100 * 2**30, 2 * 2**30),  # capped
        (5000, 100 * 2**30, 5000),
        (-1, 100 * 2**30, -1),
    ],
)
def test_default_total_is_a_tenth_of_the_file_system_at_most_2_gib(
    configured: int | None, fs_bytes: int, expected: int
) -> None:
    assert auto_limit(configured, fs_bytes=fs_bytes, fraction=0.10, cap=2 << 30) == expected


# -- through the writer process ----------------------------------------------------------


def raw(seq: int) -> list[RawEvent]:
    return [LifecycleEvent(ts=seq, event="acked", msg_id=seq, address="a", queue="q").raw()]


def start(directory: Path, **config: Any) -> EventLogWriter:
    w = PatientWriter(
        directory,
        broker_name="b1",
        config=EventLogConfig(**config),
        clock_ms=lambda: 1_700_000_000_000,
    )
    w.start()
    return w


def old_file(directory: Path, name: str, *, days: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text('{"seq":0}\n')
    then = time.time() - days * 86_400
    os.utime(path, (then, then))
    return path


def test_writer_keeps_the_newest_files_within_max_total_bytes(tmp_path: Path) -> None:
    """Issue 17: with tiny limits the writer process deletes the oldest rotated files, and
    reports what it deleted (none compacted: no analyze run) and what is left."""
    w = start(tmp_path, max_file_bytes=1500, max_total_bytes=6000, compress=False)
    for seq in range(1, 41):
        w.submit(raw(seq))  # no timer: a frame a submit
    w.close()
    files = finished_files(tmp_path)
    sizes = [p.stat().st_size for p in files]
    assert sum(sizes) <= 6000
    seqs = [e["seq"] for e in read_events(tmp_path)]
    assert seqs == list(range(seqs[0], 41))  # the newest, without a gap
    assert seqs[0] > 1
    disk, count, oldest, deleted, deleted_bytes, lost, lost_bytes = w.disk
    assert (disk, count) == (sum(sizes), len(files))
    assert oldest is not None
    assert deleted > 0
    assert (lost, lost_bytes) == (deleted, deleted_bytes)  # analyze never ran
    assert w.dropped_total == 0


def test_rotated_files_are_gzipped_and_hold_the_same_lines(tmp_path: Path) -> None:
    """Issue 17: `compress` (the default) turns a rotated `.part` straight into
    `.jsonl.gz`, never a plain `.jsonl` that `analyze` could read a second time."""
    w = start(tmp_path, max_file_bytes=1500)
    for seq in range(1, 11):
        w.submit(raw(seq))
    w.close()
    files = sorted(tmp_path.iterdir())
    assert len(files) > 1  # rotated by size
    assert all(p.name.endswith(".jsonl.gz") for p in files)
    assert all(p.read_bytes()[:2] == b"\x1f\x8b" for p in files)  # gzip members
    assert [e["seq"] for e in read_events(tmp_path)] == list(range(1, 11))


# pyproject.toml's platform marker of the `isal` dependency.
ISAL_MACHINES = frozenset({"x86_64", "AMD64", "aarch64", "arm64"})


def test_rotated_files_are_gzipped_by_isa_l_and_read_back_by_stdlib_gzip(
    tmp_path: Path,
) -> None:
    """Issue 20: the writer process gzips with ISA-L (the `isal` dependency), ~5x less CPU
    than zlib; its files are ordinary gzip that `gzip`, and so `analyze`, reads. Fails if
    the dependency is missing where pyproject.toml installs it (its platform marker) and
    the writer silently fell back to zlib; elsewhere the fallback is the standard gzip."""
    from amqpbroker.eventlog import child as child_module

    if platform.machine() in ISAL_MACHINES:
        from isal import igzip

        assert child_module._GzipFile is igzip.GzipFile
    else:
        assert child_module._GzipFile is gzip.GzipFile
    lines = b"".join(b'{"seq":%d,"event":"acked"}\n' % n for n in range(50_000))
    part = tmp_path / "events-20261129T120000000Z.jsonl.part"
    part.write_bytes(lines)
    child(tmp_path, FakeFs(100 << 30), compress=True)._finish(part)
    [gz] = tmp_path.iterdir()
    assert gz.name == "events-20261129T120000000Z.jsonl.gz"
    assert gzip.decompress(gz.read_bytes()) == lines
    assert gz.stat().st_size < len(lines) // 10


def test_files_older_than_max_age_are_deleted_at_start(tmp_path: Path) -> None:
    """Issue 17: an idle broker's old files go too (retention runs at start and every
    minute, not only at rotation)."""
    old = old_file(tmp_path, "events-20200101T000000000Z.jsonl", days=8)
    recent = old_file(tmp_path, "events-20200102T000000000Z.jsonl.gz", days=6)
    w = start(tmp_path)
    w.submit(raw(1))
    w.close()
    assert not old.exists()
    assert recent.exists()
    assert w.disk[3:] == (1, 10, 1, 10)


@pytest.mark.parametrize("keep", [True, False])
def test_keep_until_analyzed_keeps_what_no_analyze_run_compacted(
    tmp_path: Path, keep: bool
) -> None:
    """Issue 17: with keep-until-analyzed, a file missing from analyze's marker is never
    deleted; without it, its deletion is counted as lost to analysis."""
    compacted = old_file(tmp_path, "events-20200101T000000000Z.jsonl", days=30)
    pending = old_file(tmp_path, "events-20200102T000000000Z.jsonl.gz", days=30)
    (tmp_path / COMPACTED_MARKER).write_text(json.dumps({"files": [compacted.name]}))
    w = start(tmp_path, keep_until_analyzed=keep)
    w.submit(raw(1))
    w.close()
    assert not compacted.exists()
    assert pending.exists() is keep
    deleted, deleted_bytes, lost, lost_bytes = w.disk[3:]
    assert (deleted, lost) == ((1, 0) if keep else (2, 1))
    assert (deleted_bytes, lost_bytes) == (10 * deleted, 10 * lost)


def test_kept_files_over_max_total_bytes_are_warned_about_once(tmp_path: Path) -> None:
    """Issue 17: keep-until-analyzed may hold the log over its budget; the operator is
    told (once) that analyze has to run."""
    old_file(tmp_path, "events-20200101T000000000Z.jsonl", days=1)
    w = child(tmp_path, FakeFs(free=50 << 30), max_total_bytes=5, keep_until_analyzed=True)
    w._retain()
    w._retain()
    assert [text for _, text in w.logs if "over max-total-bytes" in text] != []
    assert len([text for _, text in w.logs if "over max-total-bytes" in text]) == 1
    assert (tmp_path / "events-20200101T000000000Z.jsonl").exists()


def test_events_are_dropped_and_counted_below_min_free_bytes(tmp_path: Path) -> None:
    """Issue 17 / B-170: below the free-space floor the writer drops events (counted, a
    seq gap), writing nothing: the journal keeps the disk."""
    w = start(tmp_path, min_free_bytes=1 << 62)
    for seq in range(1, 6):
        w.submit(raw(seq))
    w.close()
    assert w.dropped_total == 5
    assert w.written_total == 0
    assert read_events(tmp_path) == []
    assert not list(tmp_path.glob("*.part"))


# -- in-process: an injected statvfs -------------------------------------------------------


class FakeFs:
    """statvfs of a 100 GiB file system with `free` bytes available."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.calls = 0

    def __call__(self, path: str) -> os.statvfs_result:
        self.calls += 1
        frsize = 4096
        blocks, avail = (100 << 30) // frsize, self.free // frsize
        return os.statvfs_result((frsize, frsize, blocks, avail, avail, 0, 0, 0, 0, 255))


def child(directory: Path, fs: FakeFs, **config: Any) -> ChildWriter:
    base: dict[str, Any] = {
        "directory": str(directory),
        "broker": "b1",
        "properties": [],
        "body_hash": False,
        "max_file_bytes": 1 << 20,
        "max_file_age": 60_000,
        "min_free_bytes": None,
    }
    return ChildWriter({**base, **config}, report=lambda: None, statvfs=fs)


def test_floor_drops_while_free_space_is_low_and_resumes_after(tmp_path: Path) -> None:
    """Issue 17: the default floor on a 100 GiB disk is 1 GiB; below it frames are
    dropped and counted, statvfs is read at most every space_check_seconds, and writing
    resumes when space comes back; both changes are logged."""
    fs = FakeFs(free=2 << 30)
    w = child(tmp_path, fs)
    assert w.min_free_bytes == 1 << 30
    try:
        w.write_frame(1, NOW_MS, raw(1))
        fs.free = 512 << 20
        w.write_frame(2, NOW_MS, raw(2))  # the last reading is fresh: still written
        assert (w.written_total, w.dropped_total) == (2, 0)
        w.space_check_seconds = 0
        w.write_frame(3, NOW_MS, raw(3) + raw(4))
        assert (w.written_total, w.dropped_total) == (2, 2)
        fs.free = 2 << 30
        w.write_frame(5, NOW_MS, raw(5))
        assert (w.written_total, w.dropped_total) == (3, 2)
        assert [level for level, text in w.logs if "free" in text] == [30, 30]  # WARNING x2
    finally:
        w._rotate()
    assert [e["seq"] for e in read_events(tmp_path)] == [1, 2, 5]


def test_a_compression_left_half_done_by_a_dead_writer_is_tidied_at_start(tmp_path: Path) -> None:
    """Issue 17: a `.jsonl.gz.tmp` (compression cut short) is removed, and so is a `.part`
    whose `.jsonl.gz` is complete; a `.part` without one stays (never deleted)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "events-1.jsonl.gz.tmp").write_bytes(b"\x1f\x8b")
    (tmp_path / "events-1.jsonl.part").write_text("{}\n")
    (tmp_path / "events-2.jsonl.part").write_text("{}\n")
    (tmp_path / "events-2.jsonl.gz").write_bytes(gzip.compress(b"{}\n"))
    (tmp_path / "events-3.jsonl.part").write_text("{}\n")
    w = child(tmp_path, FakeFs(free=50 << 30))
    w._tidy()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "events-1.jsonl.part",
        "events-2.jsonl.gz",
        "events-3.jsonl.part",
    ]


@pytest.mark.parametrize(
    "marker",
    ["nested", "fifo", "huge", "directory"],
)
def test_a_hostile_marker_reads_as_no_marker(
    tmp_path: Path, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Third attack pass (issue 17): a `.compacted.json` nested 200,000 deep killed the
    writer process with RecursionError at its next retention (every event after it was
    dropped); a FIFO there would hang it, an endless file fill it. Each reads as no
    marker now (every file not yet compacted), with one warning, and the writer goes on."""
    import amqpbroker.eventlog.child as child_module

    path = tmp_path / COMPACTED_MARKER
    if marker == "nested":
        path.write_text("[" * 200_000)
    elif marker == "fifo":
        os.mkfifo(path)
    elif marker == "huge":
        monkeypatch.setattr(child_module, "MAX_MARKER_BYTES", 1000)
        path.write_text(json.dumps({"files": ["events-x.jsonl"] * 100}))
    else:
        path.mkdir()
    kept = old_file(tmp_path, "events-20200101T000000000Z.jsonl", days=30)
    w = child(tmp_path, FakeFs(free=50 << 30), max_total_bytes=5, keep_until_analyzed=True)
    w._retain()
    assert kept.exists()
    assert [text for _, text in w.logs if "cannot read" in text] != []
