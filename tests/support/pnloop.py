"""The hot path's fused engine calls (`amqpbroker/protocol/_pnloop.c`, issue 20) for the
tests of both builds: the installed module, or, where the build has none (editable
installs), the same source built here once per process through setup.py's own cffi step,
so that the fused event loop is tested in every tier; and a switch of the (pure-Python)
hot path between the fused calls and proton's binding one by one."""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from amqpbroker.protocol import pnloop, shell, transfers

ROOT = Path(__file__).resolve().parents[2]
_built: list[ModuleType] = []


def compiled() -> bool:
    """Whether the hot path is mypyc's (its module names are C statics then: no switch)."""
    return str(transfers.__file__).endswith(".so")


def fused_module() -> ModuleType:
    """`_pnloop`: the installed one, else built from its source (bound to proton)."""
    try:
        from amqpbroker.protocol import _pnloop  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        if os.environ.get("AMQPBROKER_COMPILED") == "1":
            raise  # the compiled build must have it (setup.py)
    else:
        return _pnloop  # type: ignore[no-any-return,unused-ignore]
    if not _built:
        _built.append(_build())
    return _built[0]


def _build() -> ModuleType:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    if shutil.which(compiler[0]) is None:
        # Not a skip: `make test` already needs one (python-qpid-proton compiles at install).
        pytest.fail(f"no C compiler ({compiler[0]}) to build _pnloop for its tests")
    spec = importlib.util.spec_from_file_location("amqpbroker_setup", ROOT / "setup.py")
    assert spec is not None
    assert spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    scratch = tempfile.mkdtemp(prefix="pnloop-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    cwd = os.getcwd()
    os.chdir(ROOT)  # setup.py's paths are the repository's
    try:
        [extension] = setup.cffi_sources(Path(scratch))
    finally:
        os.chdir(cwd)
    name = "amqpbroker.protocol._pnloop"
    out = Path(scratch) / ("_pnloop" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [*compiler, "-O2", "-shared", "-fPIC", f"-I{include}", *extension.sources, "-o", str(out)],
        check=True,
        timeout=120,
    )
    loader = importlib.machinery.ExtensionFileLoader(name, str(out))
    module_spec = importlib.util.spec_from_file_location(name, out, loader=loader)
    assert module_spec is not None
    module = importlib.util.module_from_spec(module_spec)
    loader.exec_module(module)
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
    new_slots = fused_module().ffi.new
    monkeypatch.setattr(
        pnloop, "new_slots", lambda: (new_slots("void *[3]"), new_slots("int64_t[3]"))
    )
