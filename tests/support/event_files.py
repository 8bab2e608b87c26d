"""Reading the lifecycle event log as the broker leaves it: `.jsonl` and `.jsonl.gz` files
(B-170; issue 17: rotated files are gzipped by default)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

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
