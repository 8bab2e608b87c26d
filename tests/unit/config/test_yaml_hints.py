"""What a careless operator writes, told what to write (user pass, session 9): a tab where
YAML wants spaces (PyYAML's `found character '\\t' that cannot start any token` is kept,
with what to do about it), YAML 1.1 booleans (`yes`), a bare port for `http.bind`."""

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


def test_yaml_11_booleans_are_told_to_be_true_or_false() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("persistence:\n  enabled: yes\n  sync: Off\n", source="b.yaml")
    hint = "(write true or false: YAML 1.2 reads yes/no/on/off as text)"
    assert [str(p) for p in caught.value.problems] == [
        f"b.yaml:2: persistence.enabled: not a boolean: 'yes' {hint}",
        f"b.yaml:3: persistence.sync: not a boolean: 'Off' {hint}",
    ]


def test_other_text_for_a_boolean_gets_no_hint() -> None:
    with pytest.raises(ConfigError, match=r"persistence.enabled: not a boolean: 'maybe'$"):
        parse_config("persistence:\n  enabled: maybe\n")


def test_a_bare_port_for_http_bind_is_told_the_form() -> None:
    """Before: `http.bind: not a string: 8161`."""
    with pytest.raises(ConfigError) as caught:
        parse_config("http:\n  bind: 8161\n", source="b.yaml")
    assert [str(p) for p in caught.value.problems] == [
        "b.yaml:2: http.bind: expected HOST:PORT, such as 127.0.0.1:8161, not a port alone"
    ]
    assert parse_config("http:\n  bind: localhost:8161\n").http.port == 8161
