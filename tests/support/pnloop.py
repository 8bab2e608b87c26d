"""The hot path's fused engine calls (`amqpbroker/protocol/_pnloop.c`, issue 20) for the
tests of both builds (`support.cext`): the installed module, or, where the build has none
(editable installs), the same source built here once per process through setup.py's own
cffi step, so that the fused event loop is tested in every tier; and a switch of the
(pure-Python) hot path between the fused calls and proton's binding one by one."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from amqpbroker.protocol import pnloop, shell, transfers
from support import cext

ROOT = Path(__file__).resolve().parents[2]


def compiled() -> bool:
    """Whether the hot path is mypyc's (its module names are C statics then: no switch)."""
    return str(transfers.__file__).endswith(".so")


def fused_module() -> ModuleType:
    """`_pnloop`: the installed one, else built from its source (bound to proton)."""
    return cext.installed_or_built("amqpbroker.protocol._pnloop", _build)


def _build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("amqpbroker_setup", ROOT / "setup.py")
    assert spec is not None
    assert spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)

    def sources(scratch: Path) -> list[str]:
        cwd = os.getcwd()
        os.chdir(ROOT)  # setup.py's paths are the repository's
        try:
            [extension] = setup.cffi_sources(scratch)
        finally:
            os.chdir(cwd)
        return list(extension.sources)

    module = cext.build("amqpbroker.protocol._pnloop", sources)
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
    lib: Any = fused_module().lib if mode == "fused" else None
    monkeypatch.setattr(transfers, "_FAST", lib is not None)
    monkeypatch.setattr(transfers, "_next_event", lib.amqpb_next if lib else None)
    monkeypatch.setattr(transfers, "_recv", lib.amqpb_recv if lib else pnloop._recv)
    monkeypatch.setattr(transfers, "_accept", lib.amqpb_accept if lib else pnloop._accept)
    monkeypatch.setattr(
        transfers, "_settle", lib.amqpb_settle if lib else pnloop._pn_delivery_settle
    )
    monkeypatch.setattr(shell, "_send", lib.amqpb_send if lib else pnloop._send)
    monkeypatch.setattr(shell, "_FAST_SEND", lib is not None)
    monkeypatch.setattr(
        transfers, "_accept_stored", lib.amqpb_accept_stored if lib else pnloop._accept_stored
    )
    module = fused_module()
    monkeypatch.setattr(pnloop, "new_slots", lambda: pnloop.slots_of(module))
