"""setup.py's optional mypyc build (issue 20): what it compiles and when it does not."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("amqpbroker_setup", ROOT / "setup.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() is not called
    return module


def test_every_hot_module_exists() -> None:
    """A renamed or split hot module must be renamed in HOT_MODULES too: setup.py skips
    missing paths, so the compiled build would silently lose it (issue 20)."""
    setup = _setup_module()
    missing = [m for m in setup.HOT_MODULES if not (ROOT / m).is_file()]
    assert missing == []


def test_pure_python_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Editable and plain installs stay pure Python: a compiled module beside its source
    would shadow later edits (issue 20)."""
    monkeypatch.delenv("AMQPBROKER_MYPYC", raising=False)
    assert _setup_module().ext_modules() == []


def test_no_mypyc_means_pure_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked to compile without mypyc installed: the install goes on, pure Python."""
    monkeypatch.setenv("AMQPBROKER_MYPYC", "1")
    monkeypatch.setitem(__import__("sys").modules, "mypyc.build", None)  # import fails
    assert _setup_module().ext_modules() == []


def test_the_hot_modules_are_compiled_exactly_when_expected() -> None:
    """`make test-compiled` (AMQPBROKER_COMPILED=1) runs the unit tier against the compiled
    build: each module of HOT_MODULES must then really be a loaded C extension, or the
    tier would silently test pure Python; otherwise (editable installs) none is (issue 20)."""
    compiled = os.environ.get("AMQPBROKER_COMPILED") == "1"
    loaded = {}
    for path in _setup_module().HOT_MODULES:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        loaded[path] = str(module.__file__).endswith(".so")
    assert loaded == dict.fromkeys(loaded, compiled)


def test_the_c_modules_are_built_exactly_when_expected() -> None:
    """The hand-written C of setup.py C_MODULES (the open's frame reader, issue 23) is
    built with the compiled build, and absent from editable installs (its module falls
    back to Python): `make test-compiled` must test it, not the fallback."""
    setup = _setup_module()
    compiled = os.environ.get("AMQPBROKER_COMPILED") == "1"
    for name, source in setup.C_MODULES.items():
        assert (ROOT / source).is_file()
        assert (importlib.util.find_spec(name) is not None) == compiled, name


def test_the_recovery_read_path_is_compiled() -> None:
    """Issue 23 item 4: the open's per-frame and per-record loops (`store/frames.py`), the
    liveness rules they apply, the state and the recovery into the broker are compiled
    with the codec they call: with the loop interpreted and the codec compiled, the open
    of 200k messages took 4.6 CPU-s against 2.7 in pure Python (main 876988f)."""
    hot = set(_setup_module().HOT_MODULES)
    read_path = {
        f"amqpbroker/store/{name}.py"
        for name in ("codec", "frames", "locs", "liveness", "state", "recovery")
    }
    assert read_path <= hot


def test_the_fused_engine_calls_are_used_exactly_when_built() -> None:
    """The hot path's fused engine calls (`protocol/_pnloop.c`, setup.py C_MODULES, issue
    20) are built with the compiled build and used there (`pnloop.FAST`: pointers as int
    keys); editable installs call proton's binding one call at a time."""
    from amqpbroker.protocol import pnloop

    setup = _setup_module()
    assert "amqpbroker.protocol._pnloop" in setup.C_MODULES
    assert (os.environ.get("AMQPBROKER_COMPILED") == "1") == pnloop.FAST
