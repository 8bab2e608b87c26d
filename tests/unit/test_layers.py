"""The dependency drawing of STYLE.md section 2 and docs/architecture.md, enforced (issue 18).

```
cli -> server -> protocol, store, eventlog, management, metrics, security -> config -> core
                                                                      (all) -> amqp
analytics -> stdlib, pyspark                   (the broker never imports analytics)
```

Every import of every module is read with `ast` (also those inside functions and under
`TYPE_CHECKING`: a lazy import is still a dependency), and two things are checked:

* a package imports only the packages its row of `ALLOWED` names, and only the
  third-party distributions of `THIRD_PARTY` (proton only in `protocol/`, ...);
* no import cycle between modules. `from pkg import name` depends on `pkg/__init__.py`
  (it runs it), so a module that imports its own package's `__init__` while that
  `__init__` imports it is a cycle, even if today's import order happens to work.

The rules are data, and the checks are plain functions over a {module: imports} graph, so
the tests at the bottom show that the back-edges the issue found would fail here.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

Graph = Mapping[str, set[str]]

# package -> the other amqpbroker packages it may import. The root `amqpbroker/__init__.py`
# (the version) may be imported by any.
_MIDDLE = {"config", "core", "amqp"}
ALLOWED: dict[str, set[str]] = {
    "amqp": set(),
    "core": set(),
    "config": {"core"},
    "protocol": _MIDDLE,
    "store": _MIDDLE,
    "eventlog": _MIDDLE,
    "management": _MIDDLE,
    "metrics": _MIDDLE,
    "security": _MIDDLE,
    "analytics": set(),
    "server": _MIDDLE | {"protocol", "store", "eventlog", "management", "metrics", "security"},
    "cli": _MIDDLE
    | {"protocol", "store", "eventlog", "management", "metrics", "security", "server"}
    | {"analytics"},  # `amqpbroker analyze` starts the job
    "__main__": {"cli"},
}
# package -> third-party top-level modules it may import (anything else: stdlib only).
THIRD_PARTY: dict[str, set[str]] = {
    "amqp": {"mypy_extensions"},  # mypyc_attr for the compiled build (setup.py, issue 20)
    "protocol": {"proton", "cproton_ffi"},
    "config": {"yaml"},
    "security": {"cryptography"},
    "metrics": {"prometheus_client"},
    "analytics": {"pyspark"},
}


def module_name(root: Path, path: Path) -> str:
    """`amqpbroker/store/journal.py` -> `amqpbroker.store.journal` (a package: its name)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The room a module lives in: `core`, `protocol`, ..., `server`, `cli`; `amqpbroker`
    for the root package."""
    parts = module.split(".")
    if len(parts) == 1:
        return "amqpbroker"
    return parts[1]


def imports_of(module: str, is_package: bool, source: str, modules: Iterable[str]) -> set[str]:
    """Every module `source` imports (absolute names; third-party ones by top name)."""
    known = set(modules)
    here = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)  # `from pkg import x` runs pkg/__init__.py
            found.update(
                f"{target}.{alias.name}"
                for alias in node.names
                if f"{target}.{alias.name}" in known
            )
    return found


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(internal graph {module: amqpbroker modules}, {module: other top-level imports})."""
    paths = {module_name(root, p): p for p in sorted((root / "amqpbroker").rglob("*.py"))}
    internal: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for name, path in paths.items():
        found = imports_of(name, path.name == "__init__.py", path.read_text(), paths)
        internal[name] = {m for m in found if m.split(".")[0] == "amqpbroker" and m != name}
        external[name] = {m.split(".")[0] for m in found if m.split(".")[0] != "amqpbroker"}
    return internal, external


def layer_violations(graph: Graph) -> list[str]:
    """`a -> b` edges the drawing does not allow."""
    bad = []
    for module, targets in sorted(graph.items()):
        mine = package_of(module)
        allowed = ALLOWED.get(mine, set()) | {mine, "amqpbroker"}
        bad.extend(f"{module} -> {t}" for t in sorted(targets) if package_of(t) not in allowed)
    return bad


def third_party_violations(external: Graph) -> list[str]:
    """Third-party imports outside the one room that may use that distribution."""
    bad = []
    for module, tops in sorted(external.items()):
        allowed = THIRD_PARTY.get(package_of(module), set()) | {"__future__"}
        bad.extend(
            f"{module} -> {top}"
            for top in sorted(tops)
            if top not in sys.stdlib_module_names and top not in allowed
        )
    return bad


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


GRAPH, EXTERNAL = import_graph(ROOT)


def test_every_package_has_a_row() -> None:
    """A new room needs a decision about what it may import, not a silent default."""
    assert {package_of(m) for m in GRAPH} - {"amqpbroker"} <= set(ALLOWED)


def test_packages_import_only_what_the_drawing_allows() -> None:
    """STYLE.md section 2: e.g. `store/` never imports `protocol/`; `amqp/` nothing."""
    assert layer_violations(GRAPH) == []


def test_third_party_only_in_its_room() -> None:
    """proton only in protocol/, yaml only in config/, pyspark only in analytics/, ..."""
    assert third_party_violations(EXTERNAL) == []


def test_no_import_cycles_between_modules() -> None:
    """No module reaches itself through imports (lazy ones included)."""
    assert cycles(GRAPH) == []


# --- the checks catch what issue 18 found ---------------------------------------------


@pytest.mark.parametrize(
    "edge",
    [
        ("amqpbroker.store.recovery", "amqpbroker.protocol.handler"),
        ("amqpbroker.management.api", "amqpbroker.protocol.sections"),
        ("amqpbroker.eventlog.child", "amqpbroker.protocol.sections"),
        ("amqpbroker.core.queue", "amqpbroker.config.schema"),
        ("amqpbroker.amqp.sections", "amqpbroker.core.model"),
        ("amqpbroker.server", "amqpbroker.analytics.job"),
    ],
)
def test_a_back_edge_is_reported(edge: tuple[str, str]) -> None:
    """Each of these is a back-edge of the drawing (the first three existed before #18;
    `protocol.sections`, the codec's old home, is gone, but the edge must still fail)."""
    source, target = edge
    assert layer_violations({source: {target}}) == [f"{source} -> {target}"]


def test_proton_outside_protocol_is_reported() -> None:
    assert third_party_violations({"amqpbroker.store.recovery": {"proton"}}) == [
        "amqpbroker.store.recovery -> proton"
    ]


def test_a_lazy_import_and_a_package_init_count() -> None:
    """The cycles issue 18 listed: config/load <-> artemis_xml through an import inside a
    function, store/__init__ <-> journal through `from amqpbroker.store import codec`."""
    modules = ["amqpbroker.config.load", "amqpbroker.store", "amqpbroker.store.codec"]
    lazy = "def load():\n    from amqpbroker.config.artemis_xml import parse\n"
    assert imports_of("amqpbroker.config.load", False, lazy, modules) == {
        "amqpbroker.config.artemis_xml"
    }
    via_init = "from amqpbroker.store import codec\n"
    assert imports_of("amqpbroker.store.journal", False, via_init, modules) == {
        "amqpbroker.store",
        "amqpbroker.store.codec",
    }
    relative = "from . import codec\n"
    assert imports_of("amqpbroker.store.journal", False, relative, modules) == {
        "amqpbroker.store",
        "amqpbroker.store.codec",
    }


def test_cycles_are_found() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
        "e": {"f"},
        "f": {"e"},
    }
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
