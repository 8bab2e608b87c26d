"""The dependency drawing of docs/architecture.md (STYLE.md section 2), enforced (issue 18).

The rules are the "may import" column of the room table in docs/architecture.md, read
here (`rules_from`): backticked packages before the `;`, third-party modules after it.
Every import of every module is read with `ast` (also those inside functions and under
`TYPE_CHECKING`: a lazy import is still a dependency), and four things are checked:

* a room imports only the rooms its row names (and the root `amqpbroker`, the version);
* a room imports only the third-party modules its row names (proton only in `protocol/`);
* no import cycle between modules. `from pkg import name` depends on `pkg/__init__.py`
  (it runs it), so a module that imports its own package's `__init__` while that
  `__init__` imports it is a cycle, even if today's import order happens to work;
* no room imports another room's private (`_name`) module or name (STYLE.md section 2:
  never `from amqpbroker.core.queue import _Ref`). Importing a public module of another
  room (`from amqpbroker.core.records import Record`) is allowed: docs/decisions.md says
  why the "through `__init__` only" rule is not enforced.

The checks are plain functions over a {module: imports} graph, so the tests at the
bottom feed them the back-edges and cycles issue 18 found, as source text, and show each
one fails.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"

Graph = Mapping[str, set[str]]


def rules_from(markdown: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({room: rooms it may import}, {room: third-party modules it may import}) from the
    room table of the "Layers and dependency direction" section."""
    section = markdown.split("## Layers and dependency direction", 1)[1].split("\n## ", 1)[0]
    allowed: dict[str, set[str]] = {}
    third_party: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        room = re.fullmatch(r"`(\w+)(?:/|\.py)`", cells[0])
        if not line.startswith("| `") or room is None:
            continue
        rooms, _, modules = cells[-1].partition(";")
        allowed[room.group(1)] = set(re.findall(r"`(\w+)`", rooms))
        third_party[room.group(1)] = set(re.findall(r"`(\w+)`", modules))
    return allowed, third_party


def modules_named(markdown: str) -> dict[str, set[str]]:
    """{room: the `name.py` files its row of the room table names}."""
    section = markdown.split("## Layers and dependency direction", 1)[1].split("\n## ", 1)[0]
    named: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        room = re.fullmatch(r"`(\w+)/`", cells[0])
        if line.startswith("| `") and room is not None:
            named[room.group(1)] = set(re.findall(r"`(\w+\.py)`", cells[1]))
    return named


ALLOWED, THIRD_PARTY = rules_from(ARCHITECTURE.read_text())


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
    found: set[str] = set()
    for target, names in import_statements(module, is_package, source):
        found.add(target)  # `from pkg import x` runs pkg/__init__.py
        found.update(f"{target}.{name}" for name in names if f"{target}.{name}" in known)
    return found


def import_statements(
    module: str, is_package: bool, source: str
) -> Iterable[tuple[str, list[str]]]:
    """(absolute module, names imported from it) per import in `source`: `import a.b` is
    ("a.b", []), `from ..x import y` in `pkg.sub.m` is ("pkg.x", ["y"])."""
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, [alias.name for alias in node.names]


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


def private_imports(module: str, is_package: bool, source: str) -> list[str]:
    """Another room's private modules or names that `source` imports (`_name`, not
    `__init__`-style dunders): the room's inside, which only its own modules may use."""
    bad = []
    for statement, names in import_statements(module, is_package, source):
        for target in [f"{statement}.{name}" for name in names] if names else [statement]:
            if target.split(".")[0] != "amqpbroker" or package_of(target) == package_of(module):
                continue
            parts = target.split(".")[1:]
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                bad.append(f"{module} -> {target}")
    return bad


def all_private_imports(root: Path) -> list[str]:
    bad = []
    for path in sorted((root / "amqpbroker").rglob("*.py")):
        name = module_name(root, path)
        bad.extend(private_imports(name, path.name == "__init__.py", path.read_text()))
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


@functools.cache
def tree() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """`import_graph(ROOT)`, parsed once and only by the process that runs these tests,
    not at import: every xdist worker collects this module (docs/decisions.md, "Suite
    time, sixth pass")."""
    return import_graph(ROOT)


def test_every_package_has_a_row() -> None:
    """A new room needs a decision about what it may import, not a silent default."""
    assert {package_of(m) for m in tree()[0]} - {"amqpbroker"} <= set(ALLOWED)


def test_packages_import_only_what_the_drawing_allows() -> None:
    """STYLE.md section 2: e.g. `store/` never imports `protocol/`; `amqp/` nothing."""
    assert layer_violations(tree()[0]) == []


def test_third_party_only_in_its_room() -> None:
    """proton only in protocol/, yaml only in config/, pyspark only in analytics/, ..."""
    assert third_party_violations(tree()[1]) == []


def test_no_import_cycles_between_modules() -> None:
    """No module reaches itself through imports (lazy ones included)."""
    assert cycles(tree()[0]) == []


def test_no_room_imports_another_rooms_private_parts() -> None:
    """STYLE.md section 2: never `from amqpbroker.core.queue import _Ref`."""
    assert all_private_imports(ROOT) == []


# --- the rules are the documented ones, and the checks catch what issue 18 found -------


def test_the_rules_are_the_architecture_table() -> None:
    """The rows read from docs/architecture.md say what the drawing says."""
    assert ALLOWED["amqp"] == ALLOWED["core"] == set()
    assert ALLOWED["config"] == {"core"}
    for room in ("protocol", "store", "eventlog", "management", "metrics", "security"):
        assert ALLOWED[room] == {"core", "amqp", "config"}, room
    assert ALLOWED["server"] == {"core", "amqp", "config"} | {
        "protocol",
        "store",
        "eventlog",
        "management",
        "metrics",
        "security",
    }
    assert ALLOWED["cli"] == ALLOWED["server"] | {"server", "analytics"}
    assert ALLOWED["__main__"] == {"cli"}
    assert ALLOWED["analytics"] == set()
    assert THIRD_PARTY["protocol"] == {"proton", "cproton_ffi"}
    assert THIRD_PARTY["config"] == {"yaml"}
    assert THIRD_PARTY["analytics"] == {"pyspark"}
    assert THIRD_PARTY["amqp"] == {"mypy_extensions"}  # mypyc_attr: setup.py (issue 20)
    assert THIRD_PARTY["core"] == {"mypy_extensions"}  # the same, for `Broker`
    assert THIRD_PARTY["store"] == set()
    assert THIRD_PARTY["eventlog"] == {"isal"}  # the writer process's gzip (issue 20)


def test_every_module_is_named_in_its_rooms_row() -> None:
    """docs/architecture.md is drawn from the code: a new module gets its line there."""
    named = modules_named(ARCHITECTURE.read_text())
    missing = [
        f"{path.parent.name}/{path.name}"
        for path in sorted((ROOT / "amqpbroker").glob("*/*.py"))
        if path.name != "__init__.py" and path.name not in named.get(path.parent.name, set())
    ]
    assert missing == []


def test_the_table_parser_reads_rooms_and_modules() -> None:
    markdown = (
        "# x\n## Layers and dependency direction\n\n"
        "| room | modules | may import |\n|---|---|---|\n"
        "| `store/` | `journal.py` (uses `core`) | `core`, `amqp`; `zstd` |\n"
        "| `cli.py` | commands | `server` |\n| `amqp/` | codec | stdlib only |\n"
        "## Threading model\n| `late/` | not in the section | `core` |\n"
    )
    allowed, third_party = rules_from(markdown)
    assert allowed == {"store": {"core", "amqp"}, "cli": {"server"}, "amqp": set()}
    assert third_party == {"store": {"zstd"}, "cli": set(), "amqp": set()}
    assert modules_named(markdown) == {"store": {"journal.py"}, "amqp": set()}


def graph_of(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """The internal import graph of synthetic modules ({name: source}; a name ending in
    `.__init__` is a package), as `import_graph` builds it for the tree (whose modules
    `from pkg import module` may name)."""
    names = set(tree()[0]) | {m.removesuffix(".__init__") for m in sources}
    graph = {}
    for module, source in sources.items():
        name = module.removesuffix(".__init__")
        found = imports_of(name, module.endswith(".__init__"), source, names)
        graph[name] = {m for m in found if m.split(".")[0] == "amqpbroker" and m != name}
    return graph


@pytest.mark.parametrize(
    ("module", "source", "edge"),
    [
        # the three back-edges issue 18 found (the codec then lived in protocol/)
        (
            "amqpbroker.store.recovery",
            "from amqpbroker.protocol.handler import message_of\n",
            "amqpbroker.protocol.handler",
        ),
        (
            "amqpbroker.management.http",
            "def _head(data):\n    from amqpbroker.protocol import sections\n",
            "amqpbroker.protocol",
        ),
        (
            "amqpbroker.eventlog.child",
            "from amqpbroker.protocol.sections import scan\n",
            "amqpbroker.protocol.sections",
        ),
        # and the other directions the drawing forbids
        ("amqpbroker.store.recovery", "from amqpbroker import protocol\n", "amqpbroker.protocol"),
        (
            "amqpbroker.core.queue",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from amqpbroker.config.schema import QueueDef\n",
            "amqpbroker.config.schema",
        ),
        ("amqpbroker.amqp.sections", "from ..core.model import Message\n", "amqpbroker.core.model"),
        ("amqpbroker.config.load", "import amqpbroker.store\n", "amqpbroker.store"),
        ("amqpbroker.protocol.shell", "from amqpbroker.store import api\n", "amqpbroker.store"),
        ("amqpbroker.metrics.collector", "from amqpbroker.server import X\n", "amqpbroker.server"),
        (
            "amqpbroker.server",
            "from amqpbroker.analytics.job import main\n",
            "amqpbroker.analytics.job",
        ),
        ("amqpbroker.analytics.job", "from amqpbroker.core import Broker\n", "amqpbroker.core"),
    ],
)
def test_a_back_edge_is_reported(module: str, source: str, edge: str) -> None:
    """Each source, put in `module`, imports against the drawing, lazily or not."""
    violations = layer_violations(graph_of({module: source}))
    assert f"{module} -> {edge}" in violations


def test_the_tree_without_back_edges_passes_the_same_check() -> None:
    """The check is not vacuous: the same sources in an allowed room are fine."""
    assert (
        layer_violations(graph_of({"amqpbroker.server": "from amqpbroker.protocol import x\n"}))
        == []
    )
    assert (
        layer_violations(
            graph_of({"amqpbroker.store.recovery": "from amqpbroker.core import Broker\n"})
        )
        == []
    )


def test_proton_outside_protocol_is_reported() -> None:
    assert third_party_violations({"amqpbroker.store.recovery": {"proton"}}) == [
        "amqpbroker.store.recovery -> proton"
    ]
    assert third_party_violations({"amqpbroker.protocol.shell": {"proton"}}) == []


def test_a_private_part_of_another_room_is_reported() -> None:
    source = "from amqpbroker.core.queue import _Ref, Queue\nfrom amqpbroker.core import _clock\n"
    assert private_imports("amqpbroker.management.api", False, source) == [
        "amqpbroker.management.api -> amqpbroker.core.queue._Ref",
        "amqpbroker.management.api -> amqpbroker.core._clock",
    ]
    own_room = "from amqpbroker.core.queue import _Ref\nfrom . import _private\n"
    assert private_imports("amqpbroker.core.broker", False, own_room) == []


@pytest.mark.parametrize(
    ("sources", "cycle"),
    [
        (  # issue 18: config/load.py <-> config/artemis_xml.py through a lazy import
            {
                "amqpbroker.config.load": (
                    "def load():\n    from amqpbroker.config.artemis_xml import parse\n"
                ),
                "amqpbroker.config.artemis_xml": "from amqpbroker.config.load import check\n",
            },
            ["amqpbroker.config.artemis_xml", "amqpbroker.config.load"],
        ),
        (  # issue 18: store/__init__ <-> store/journal.py (order-dependent)
            {
                "amqpbroker.store.__init__": "from amqpbroker.store.journal import FileJournal\n",
                "amqpbroker.store.journal": "from amqpbroker.store import codec\n",
                "amqpbroker.store.codec": "",
            },
            ["amqpbroker.store", "amqpbroker.store.journal"],
        ),
        (  # issue 18: metrics/__init__ <-> metrics/collector.py, relative import
            {
                "amqpbroker.metrics.__init__": "from .collector import BrokerCollector\n",
                "amqpbroker.metrics.collector": "from . import names\n",
                "amqpbroker.metrics.names": "",
            },
            ["amqpbroker.metrics", "amqpbroker.metrics.collector"],
        ),
    ],
)
def test_an_import_cycle_is_reported(sources: dict[str, str], cycle: list[str]) -> None:
    """The three module cycles issue 18 found, as source text, are found again."""
    assert cycles(graph_of(sources)) == [cycle]


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
