"""The paging keys (B-151, issue 23): global-max-size and the page-reading limits."""

from __future__ import annotations

import pytest

from amqpbroker.config import ConfigError, format_effective, parse_artemis_xml, parse_config
from tests.unit.config.test_artemis_xml import HEAD, TAIL


def test_global_max_size_is_read_and_shown() -> None:
    """B-151: a broker-level byte count; check-config prints it."""
    config = parse_config("global-max-size: 1_048_576\n")
    assert config.global_max_size == 1_048_576
    assert "global-max-size: 1048576" in format_effective(config)


def test_global_max_size_defaults_to_half_the_memory_limit() -> None:
    """B-151: -1 (the default) is worked out at start: check-config says so."""
    config = parse_config("name: b\n")
    assert config.global_max_size == -1
    assert "global-max-size: auto (half the memory limit)" in format_effective(config)


def test_global_max_size_refuses_other_negatives() -> None:
    with pytest.raises(ConfigError, match="global-max-size: must be -1"):
        parse_config("global-max-size: -2\n", source="b.yaml")


def test_global_max_size_in_broker_xml_takes_artemis_byte_units() -> None:
    """Artemis writes sizes as `10MiB` / `100Mb` (ByteUtil)."""
    config = parse_artemis_xml(HEAD + "<global-max-size>10MiB</global-max-size>\n" + TAIL)
    assert config.global_max_size == 10 * 1024 * 1024


def test_address_paging_keys_are_checked_and_shown_by_check_config() -> None:
    """B-151 (issue 23 audit: `check-config` of the paging keys): the per-address paging
    limits are printed with where they come from, and out-of-range values are refused
    with the file, line and key."""
    config = parse_config(
        'address-settings:\n  "#": {page-size-bytes: 1048576, max-read-page-bytes: 2097152,'
        " max-read-page-messages: 1000, max-size-messages: 10, address-full-policy: PAGE}\n"
    )
    shown = format_effective(config)
    for line in (
        'page-size-bytes: 1048576  # "#"',
        'max-read-page-bytes: 2097152  # "#"',
        'max-read-page-messages: 1000  # "#"',
        'max-size-messages: 10  # "#"',
    ):
        assert line in shown
    for bad, says in (
        ("page-size-bytes: 0", "page-size-bytes: must be >= 1: 0"),
        ("max-read-page-bytes: 0", "max-read-page-bytes: must be -1 (unlimited) or >= 1: 0"),
        ("max-read-page-messages: -2", "max-read-page-messages: must be -1 (unlimited)"),
        ("max-size-messages: -3", "max-size-messages: must be -1 (unlimited) or >= 0: -3"),
    ):
        with pytest.raises(ConfigError) as raised:
            parse_config(f'address-settings:\n  "#": {{{bad}}}\n', source="b.yaml")
        assert str(raised.value).startswith('b.yaml:2: address-settings."#".')
        assert says in str(raised.value)
