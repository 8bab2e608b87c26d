"""How the suite shares the two cores (`make test`: `pytest -n 2`, then `-m timing`).

`make test` runs the suite in two pytest-xdist workers with `--dist loadgroup`; a worker
runs a whole group. The groups are set here, once for every tier, so that what tests
share is set up once:

* `tests/interop` is one group: the session's certificates are made once, and the
  client builds (npm ci, apt-get as root) never run twice at the same time;
* every other module is its own group: its `broker` (scope="module") starts once, and
  the analytics modules spread over both workers (each worker starts its own one
  SparkSession, `local[1]`: at most two JVMs, one core each).

The tiers go longest first, analytics, interop, integration, unit
(`--no-loadscope-reorder` keeps this order), so that the short modules fill in behind
the long ones instead of a long one starting last.

A test that asserts how long something took (an upper bound or a ratio of wall-clock
times) carries the `timing` marker: `make test` runs those alone afterwards, with no
other worker competing for the cores. Plain `pytest` runs everything in one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ORDER = ("analytics", "interop", "integration")  # the longest tiers first, then the rest
WHOLE_TIERS = ("interop",)  # one group each; every other module is a group of its own


def _group(item: pytest.Item) -> tuple[int, str]:
    """(rank of its tier, its xdist group)."""
    path = item.path.relative_to(TESTS) if item.path.is_relative_to(TESTS) else item.path
    tier = path.parts[0]
    rank = ORDER.index(tier) if tier in ORDER else len(ORDER)
    return rank, tier if tier in WHOLE_TIERS else path.as_posix()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test its xdist group and put the long groups first (a stable sort:
    the order inside a group is the collected one)."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)[1]))
    items.sort(key=lambda item: _group(item)[0])
