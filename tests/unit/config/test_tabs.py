"""A tab where YAML wants spaces (user pass, session 9): PyYAML's `found character '\\t'
that cannot start any token` is kept, with what to do about it."""

from __future__ import annotations

import pytest

from amqpbroker.config import ConfigError, parse_config


def test_a_tab_indent_says_to_indent_with_spaces() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config('address-settings:\n  "#":\n\tmax-delivery-attempts: 3\n', source="b.yaml")
    (problem,) = caught.value.problems
    assert str(problem).startswith("b.yaml:3: (yaml): not valid YAML: found character '\\t'")
    assert str(problem).endswith(": indent with spaces, YAML does not take tabs there")


def test_a_tab_inside_a_quoted_value_is_text() -> None:
    assert parse_config('name: "a\tb"\n').name == "a\tb"
