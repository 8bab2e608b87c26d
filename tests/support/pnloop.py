"""The hot path's fused engine calls (`amqpbroker/protocol/_pnloop.c`, issue 20) for the
tests of both builds (`support.cext`): the installed module, or, where the build has none
(editable installs), the same source built here once per process, so that the fused event
loop is tested in every tier; and a switch of the (pure-Python) hot path between the fused
calls (pointers as int keys) and proton's binding one by one (cdata keys)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from amqpbroker.protocol import pnloop, shell, transfers
from support import cext

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "amqpbroker" / "protocol" / "_pnloop.c"


def compiled() -> bool:
    """Whether the hot path is mypyc's (its module names are C statics then: no switch)."""
    return str(transfers.__file__).endswith(".so")


def fused_module() -> ModuleType:
    """`_pnloop`: the installed one, else built from its source (bound to proton)."""
    return cext.installed_or_built("amqpbroker.protocol._pnloop", _build)


def _build() -> ModuleType:
    # Under its bare name, as support/framescan.py does: a single-phase extension is
    # entered in `sys.modules` under the name it is loaded as, and
    # tests/unit/test_build.py checks the package has none.
    module = cext.build("_pnloop", lambda scratch: [SOURCE])
    assert pnloop.bind(module)
    return module


def modes() -> list[str]:
    """The hot path's modes a test can run: both in pure Python, the build's when compiled."""
    if compiled():
        return ["fused" if pnloop.FAST else "plain"]
    return ["fused", "plain"]


def use(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the pure-Python hot path with the fused calls or the calls one by one."""
    if compiled():
        assert mode == ("fused" if pnloop.FAST else "plain")
        return
    calls = pnloop.calls(fused_module() if mode == "fused" else None)
    for name, value in calls.items():
        monkeypatch.setattr(pnloop, name, value)  # `pnloop.key` of the pure-Python callers
        if hasattr(transfers, "_" + name):
            monkeypatch.setattr(transfers, "_" + name, value)
    monkeypatch.setattr(shell, "_send", calls["send"])
    monkeypatch.setattr(shell, "_send_headed", calls["send_headed"])
    monkeypatch.setattr(shell, "_key", calls["key"])
    monkeypatch.setattr(shell, "_FAST_SEND", calls["FAST"])
