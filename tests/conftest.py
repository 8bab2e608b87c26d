"""How the suite shares the two cores (`make test`).

`make test` runs pytest twice:

1. `-n 2 --dist loadfile --no-loadscope-reorder -m 'not timing and not interop'`: two
   pytest-xdist workers; a worker runs a whole module, so a module's `broker`
   (scope="module") starts once; the analytics modules spread over both workers (each
   worker starts its own one SparkSession, `local[1]`: at most two JVMs, one core each).
2. `-m 'timing or interop'` in one process: the tests that assert how long something took
   (an upper bound, a ratio of wall-clock times, "within 1 s": marker `timing`), with no
   other worker competing for the cores, and the client stacks (their builds, npm ci and
   apt-get as root, must not run twice at the same time on a fresh machine).

(`--dist loadgroup` would do 2's interop part in the first run, but pytest-xdist 3.8
cannot rename node ids on pytest 9, so groups are ignored there.)

The collection order here is longest tier first (analytics, integration, the rest), which
`--no-loadscope-reorder` keeps, so that short modules fill in behind the long ones instead
of a long one starting last. Plain `pytest` runs everything in one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ORDER = ("analytics", "interop", "integration")  # the longest tiers first, then the rest


def _rank(item: pytest.Item) -> int:
    path = item.path.relative_to(TESTS) if item.path.is_relative_to(TESTS) else item.path
    return ORDER.index(path.parts[0]) if path.parts[0] in ORDER else len(ORDER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tiers first (a stable sort: the order inside a module is kept)."""
    items.sort(key=_rank)
