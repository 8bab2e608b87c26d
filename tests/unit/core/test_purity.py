"""The core is sans-I/O (STYLE.md section 2): stdlib only, no sockets, threads or clock."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "amqpbroker" / "core"
FORBIDDEN = {
    "proton",
    "socket",
    "threading",
    "asyncio",
    "select",
    "selectors",
    "multiprocessing",
    "subprocess",
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_only_stdlib_and_core(path: Path) -> None:
    """No proton, sockets, threads, asyncio or third-party packages in `core`."""
    for name in _imports(path):
        top = name.split(".")[0]
        assert top not in FORBIDDEN, f"{path.name} imports {name}"
        if top == "amqpbroker":
            assert name.startswith("amqpbroker.core"), f"{path.name} imports {name}"
        else:
            # mypy_extensions: `mypyc_attr`, a no-op unless setup.py compiles (issue 20)
            assert top in sys.stdlib_module_names or top in ("__future__", "mypy_extensions"), (
                f"{path.name} imports third-party {name}"
            )


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_only_clock_reads_time(path: Path) -> None:
    """Time comes from the injected Clock; only clock.py may import `time`/`datetime`."""
    if path.name == "clock.py":
        return
    tops = {name.split(".")[0] for name in _imports(path)}
    assert not tops & {"time", "datetime"}, f"{path.name} reads the clock"
