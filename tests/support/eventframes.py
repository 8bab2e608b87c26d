"""The event-log frame's payload in C (`amqpbroker/eventlog/_frames.c`, issue 20) for the
tests of both builds (`support.cext`): the compiled build's own module, or the same source
compiled here once per process, so that the C is tested in every tier."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from support import cext

SOURCE = Path(__file__).resolve().parents[2] / "amqpbroker" / "eventlog" / "_frames.c"


def frames_module() -> ModuleType:
    """The `_frames` module: the installed one, else built from SOURCE."""
    return cext.installed_or_built("amqpbroker.eventlog._frames", _build)


def _build() -> ModuleType:
    # Under its bare name, as support/framescan.py does (tests/unit/test_build.py checks
    # the package has no module of that name outside the compiled build).
    return cext.build("_frames", lambda _: [SOURCE])
