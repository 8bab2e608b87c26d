"""Reading the lifecycle event log as the broker leaves it: `.jsonl` and `.jsonl.gz` files
(B-170; issue 17: rotated files are gzipped by default)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from amqpbroker.eventlog import EventLogWriter
from support.waiting import wait_until

T = TypeVar("T")

FINISHED = ("events-*.jsonl", "events-*.jsonl.gz")


def finished_files(directory: Path) -> list[Path]:
    """The rotated event files, plain or gzipped, in write order (names sort so)."""
    return sorted(p for pattern in FINISHED for p in directory.glob(pattern))


def file_lines(path: Path) -> list[str]:
    """The lines of one event file, decompressing a `.gz`."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return data.decode().splitlines()


def read_events(directory: Path) -> list[dict[str, Any]]:
    """Every event of the rotated files, in write order."""
    return [json.loads(line) for path in finished_files(directory) for line in file_lines(path)]


# How long a test waits for a writer process to finish its files. The writer's own bound
# (`close(timeout=5.0)`) is the broker's shutdown budget; on a loaded 2-core host the
# process's start alone (an interpreter and its imports) took longer, so `close` left it
# running: no finished file yet ("not enough values to unpack") and, once the `Popen` was
# collected, "subprocess N is still running" (a ResourceWarning, an error here). A wait
# for a process that exits returns at once; pytest-timeout (60 s) still bounds the test.
FINISH_SECONDS = 30.0


class PatientWriter(EventLogWriter):
    """The writer as the broker runs it, whose `close` waits up to FINISH_SECONDS by
    default (a test that means a shorter bound passes it)."""

    def close(self, timeout: float = FINISH_SECONDS) -> None:
        super().close(timeout)


def wait_for_writer(predicate: Callable[[], T], *, message: str = "the writer process") -> T:
    """`wait_until` for what a writer process does, with its bound (FINISH_SECONDS)."""
    return wait_until(predicate, timeout=FINISH_SECONDS, message=message)
