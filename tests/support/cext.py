"""The broker's C extensions for the tests of both builds, one place for how a test
process gets one: the installed module (the compiled build), or, where the build has none
(editable installs never build them), its source compiled and loaded here once per
process, so that the C is tested in every tier (`support.framescan`, `support.pnloop`)."""

from __future__ import annotations

import atexit
import importlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

_built: dict[str, ModuleType] = {}


def installed_or_built(name: str, build: Callable[[], ModuleType]) -> ModuleType:
    """The module `name` as installed, else `build()`'s (once per process). Under `make
    test-compiled` (AMQPBROKER_COMPILED=1) the installed one must exist (setup.py)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("AMQPBROKER_COMPILED") == "1":
            raise
    if name not in _built:
        _built[name] = build()
    return _built[name]


def build(name: str, sources: Callable[[Path], Sequence[str | Path]]) -> ModuleType:
    """Compile `sources(scratch)` (a scratch directory for generated files, removed at
    exit) into the extension module `name` with the interpreter's C compiler, and load it."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    if shutil.which(compiler[0]) is None:
        # Not a skip: `make test` already needs one (python-qpid-proton compiles at install).
        pytest.fail(f"no C compiler ({compiler[0]}) to build {name} for its tests")
    scratch = Path(tempfile.mkdtemp(prefix=name.rsplit(".", 1)[-1].lstrip("_") + "-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    files = [str(path) for path in sources(scratch)]
    out = scratch / (name.rsplit(".", 1)[-1] + str(sysconfig.get_config_var("EXT_SUFFIX")))
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [*compiler, "-O2", "-shared", "-fPIC", f"-I{include}", *files, "-o", str(out)],
        check=True,
        timeout=120,
    )
    loader = importlib.machinery.ExtensionFileLoader(name, str(out))
    spec = importlib.util.spec_from_file_location(name, out, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
