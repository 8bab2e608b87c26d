"""The open's bulk frame reader in C (`amqpbroker/store/_framescan.c`, issue 23 item 4)
for the tests of both builds: the compiled build's own module, or, in the pure-Python
build (editable installs, which never build it), the same source compiled here once per
process, so that its checks are tested in every tier."""

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

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "amqpbroker" / "store" / "_framescan.c"
_built: list[ModuleType] = []


def framescan() -> ModuleType:
    """The `_framescan` module: the installed one, else built from SOURCE. Under
    `make test-compiled` (AMQPBROKER_COMPILED=1) the installed one must exist."""
    try:
        import amqpbroker.store._framescan as installed  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        if os.environ.get("AMQPBROKER_COMPILED") == "1":
            raise  # the compiled build must have it (setup.py)
    else:
        return installed
    if not _built:
        _built.append(_build())
    return _built[0]


def _build() -> ModuleType:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    if shutil.which(compiler[0]) is None:
        # Not a skip: `make test` already needs one (python-qpid-proton compiles at install).
        pytest.fail(f"no C compiler ({compiler[0]}) to build {SOURCE.name} for its tests")
    scratch = tempfile.mkdtemp(prefix="framescan-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    out = Path(scratch) / ("_framescan" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    subprocess.run(
        [
            *compiler,
            "-O2",
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            str(SOURCE),
            "-o",
            str(out),
        ],
        check=True,
        timeout=120,
    )
    loader = importlib.machinery.ExtensionFileLoader("_framescan", str(out))
    spec = importlib.util.spec_from_file_location("_framescan", out, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
