"""How the suite shares the two cores (`make test`).

`make test` runs pytest twice:

1. `-n 3 --dist loadfile --no-loadscope-reorder -m 'not timing and not long'`: three
   pytest-xdist workers on two cores (the Makefile's PYTEST_WORKERS: many tests wait on
   wall-clock timers or a client's round trips, and the third worker uses the core they
   leave idle); a worker runs a whole module, so a module's `broker`
   (scope="module") starts once. Two directories are one unit each (`GROUPED`, the
   scheduler below): tests/analytics/ (one worker, one SparkSession, one JVM warm-up;
   never two Spark JVMs at once) and tests/interop/ (the client stacks' builds, npm ci
   and apt-get as root, run one after the other in one worker, as they must on a fresh
   machine), beside each other while the other modules fill in behind them.
2. `-m 'timing and not long' tests/integration` in one process: the tests that assert how
   long something took (an upper bound, a ratio of wall-clock times, "within 1 s": marker
   `timing`), with no other worker competing for the cores. It collects tests/integration/
   alone (`TIMING_DIR`): the whole suite's collection (pyspark, the unit tier's ~4,400
   tests) was ~13 CPU-s of that process against ~3.5; a `timing` test anywhere else fails
   the collection of every run (`pytest_collection_modifyitems`), so none can be skipped
   by that tier unnoticed.

(`--dist loadgroup` with `xdist_group` marks would group too, but pytest-xdist 3.8 cannot
rename node ids on pytest 9, so groups are ignored there: hence the scheduler hook.)

The collection order here is longest unit first (analytics, interop, integration, the
rest), which `--no-loadscope-reorder` keeps, so that short modules fill in behind the long
ones instead of a long one starting last. Plain `pytest` runs everything in one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling

TESTS = Path(__file__).parent
ORDER = ("analytics", "interop", "integration")  # the longest tiers first, then the rest
GROUPED = ("analytics", "interop")  # each one xdist work unit (module docstring)
TIMING_DIR = "integration"  # the only directory `make test`'s timing tier collects


def _rank(item: pytest.Item) -> int:
    path = item.path.relative_to(TESTS) if item.path.is_relative_to(TESTS) else item.path
    return ORDER.index(path.parts[0]) if path.parts[0] in ORDER else len(ORDER)


def misplaced_timing(items: list[pytest.Item]) -> list[str]:
    """The `timing` tests outside `TIMING_DIR`, which `make test`'s timing tier would not
    collect (and the xdist tier deselects)."""
    inside = TESTS / TIMING_DIR
    return [
        item.nodeid
        for item in items
        if item.get_closest_marker("timing") is not None and not item.path.is_relative_to(inside)
    ]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tiers first (a stable sort: the order inside a module is kept); a
    `timing` test outside `TIMING_DIR` is an error (module docstring)."""
    misplaced = misplaced_timing(items)
    if misplaced:
        raise pytest.UsageError(
            f"`timing` tests belong in tests/{TIMING_DIR}/ (the Makefile's timing tier "
            f"collects only there): {', '.join(misplaced)}"
        )
    items.sort(key=_rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """`--dist loadfile`, but each directory of `GROUPED` is one work unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            parts = path.split("/")
            if len(parts) > 2 and parts[0] == "tests" and parts[1] in GROUPED:
                return f"tests/{parts[1]}/"
            return path

    return GroupedFiles(config, log)
