"""The commands and selectors the docs tell an operator to type (user pass, session 9):
every command is in the README's table; each filter parses, and
the README's dead-letter triage filter selects what it says. It said
`--filter "x-opt-DLQ-REASON = 'rejected'"`, which a selector reads as `x - opt - DLQ -
REASON`: unknown, so nothing matched and `retry` retried 0 messages without a word."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from amqpbroker.cli import build_parser
from amqpbroker.core import Message
from amqpbroker.core.selector import parse_selector

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILTER = re.compile(r"""--filter "([^"]+)"|--filter '([^']+)'""")


def _filters() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("amqpbroker "):
                found += [(path.name, a or b) for a, b in FILTER.findall(line)]
    return found


def _dead_letter(reason: str) -> Message:
    annotations = {"x-opt-ORIG-ADDRESS": "orders", "x-opt-DLQ-REASON": reason}
    return Message(b"body", properties={}, application_properties={}, annotations=annotations)


def test_the_docs_show_filters() -> None:
    assert any(name == "README.md" for name, _ in _filters())


@pytest.mark.parametrize(("doc", "text"), _filters())
def test_a_documented_filter_parses_and_names_no_hyphenated_annotation(doc: str, text: str) -> None:
    parse_selector(text)
    assert "x-opt-" not in text, f"{doc}: {text!r} subtracts identifiers; use _AMQ_* names"


def test_the_readme_triage_retry_selects_rejected_dead_letters() -> None:
    (text,) = [t for doc, t in _filters() if doc == "README.md" and "REASON" in t]
    selector = parse_selector(text)
    assert selector.matches(_dead_letter("rejected"))
    assert not selector.matches(_dead_letter("max-attempts"))


def _commands(parser: argparse.ArgumentParser, prefix: str = "amqpbroker") -> list[str]:
    """Every leaf command of the CLI ("amqpbroker user hash", ...)."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        return [prefix]
    return [
        command
        for name, child in subparsers[0].choices.items()
        for command in _commands(child, f"{prefix} {name}")
    ]


def test_the_readme_command_table_has_every_command() -> None:
    """User pass: `amqpbroker user hash` (CONTRACT's table has it) was missing."""
    table = [
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")
    ]
    missing = [c for c in _commands(build_parser()) if not any(f"| `{c}" in t for t in table)]
    assert missing == []
