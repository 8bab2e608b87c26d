"""`#:` unquoted under address-settings or security-settings (user pass, session 9): YAML
reads `#` as a comment, so the entry's keys land where patterns go. Said so with each
line; it was `expected a mapping`, and a setting left empty (`dead-letter-address:`) was
taken silently as an address pattern of that name."""

from __future__ import annotations

import pytest

from amqpbroker.config import ConfigError, parse_config

HINT = (
    "is a setting, not a match pattern: is the pattern above it missing? "
    '(an unquoted # starts a YAML comment: write "#":)'
)


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="b.yaml")
    return [str(p) for p in caught.value.problems]


def test_address_settings_under_an_unquoted_hash_are_named_as_such() -> None:
    assert _problems(
        "address-settings:\n  #:\n    max-delivery-attempts: 3\n    dead-letter-address:\n"
    ) == [
        f"b.yaml:3: address-settings.max-delivery-attempts: 'max-delivery-attempts' {HINT}",
        f"b.yaml:4: address-settings.dead-letter-address: 'dead-letter-address' {HINT}",
    ]


def test_security_settings_under_an_unquoted_hash_are_named_as_such() -> None:
    assert _problems("security:\n  security-settings:\n    #:\n      send: [admin]\n") == [
        f"b.yaml:4: security.security-settings.send: 'send' {HINT}"
    ]


def test_a_pattern_named_like_a_setting_with_an_entry_under_it_is_a_pattern() -> None:
    config = parse_config(
        "address-settings:\n  send: {max-delivery-attempts: 2}\n"
        "security:\n  security-settings:\n    send: {send: [admin]}\n"
    )
    assert dict(config.address_settings["send"].values) == {"max_delivery_attempts": 2}
    assert "send" in config.security.security_settings
