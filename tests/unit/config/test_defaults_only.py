"""A config that sets nothing (user pass, session 9): an empty or commented-out file, a
truncated copy perhaps, ran on the built-in defaults without a word, and those have no
dead-letter address, so a `rejected` message is dropped (B-046, B-103)."""

from __future__ import annotations

import pytest

from amqpbroker.config import defaults_only, format_effective, parse_config


@pytest.mark.parametrize("text", ["", "\n", "# all commented out\n# name: x\n", "---\n"])
def test_a_config_that_sets_nothing_says_so(text: str) -> None:
    config = parse_config(text, source="b.yaml")
    note = defaults_only(config)
    assert note is not None
    assert note.startswith("b.yaml sets nothing: the built-in defaults apply")
    assert "a rejected message is dropped" in note
    assert format_effective(config).splitlines()[:2] == ["# b.yaml: OK", f"# {note}"]


def test_a_config_that_sets_anything_has_no_note() -> None:
    config = parse_config("address-settings:\n  '#': {dead-letter-address: DLA}\n")
    assert defaults_only(config) is None
    assert "sets nothing" not in format_effective(config)
