"""The open's bulk frame reader in C (`amqpbroker/store/_framescan.c`, issue 23 item 4)
for the tests of both builds (`support.cext`): the compiled build's own module, or the
same source compiled here once per process, so that its checks are tested in every tier."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from support import cext

SOURCE = Path(__file__).resolve().parents[2] / "amqpbroker" / "store" / "_framescan.c"


def framescan() -> ModuleType:
    """The `_framescan` module: the installed one, else built from SOURCE."""
    return cext.installed_or_built("amqpbroker.store._framescan", _build)


def _build() -> ModuleType:
    # Under its bare name: a single-phase extension is entered in `sys.modules` under the
    # name it is loaded as, and tests/unit/test_build.py checks the package has none.
    return cext.build("_framescan", lambda _: [SOURCE])
