"""Byte sizes as Artemis writes them (user pass, session 9): `max-size-bytes: 10MB` in the
YAML file means what it means in a broker.xml (ByteUtil, binary multiples); anything else
that is not a size is refused with its file, line and key."""

from __future__ import annotations

import pytest

from amqpbroker.config import ConfigError, parse_config
from amqpbroker.config.load import text_bytes

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10MB", 10 * MIB),
        ("10Mb", 10 * MIB),
        ("10MiB", 10 * MIB),
        ("10 m", 10 * MIB),
        ("512KiB", 512 * 1024),
        ("512k", 512 * 1024),
        ("2G", 2 * 1024 * MIB),
        ("2gib", 2 * 1024 * MIB),
        ("100", 100),
        ("100b", 100),
    ],
)
def test_artemis_size_text_is_bytes(text: str, size: int) -> None:
    assert text_bytes(text) == size


@pytest.mark.parametrize("text", ["10 MBytes", "1.5MB", "-1", "MB", "10TB", "ten"])
def test_other_text_is_no_size(text: str) -> None:
    assert text_bytes(text) is None


def test_every_byte_key_of_the_yaml_file_takes_units() -> None:
    """Before: `not an integer: '10MB'` for each, though broker.xml took the same text."""
    config = parse_config(
        "global-max-size: 1GB\n"
        "event-log: {max-file-bytes: 32MiB, max-total-bytes: 1G, min-free-bytes: 100M}\n"
        'address-settings:\n  "#":\n'
        "    max-size-bytes: 10MB\n"
        "    page-size-bytes: 1MiB\n"
        "    max-read-page-bytes: 4m\n"
    )
    assert config.global_max_size == 1024 * MIB
    assert config.event_log.max_file_bytes == 32 * MIB
    assert config.event_log.max_total_bytes == 1024 * MIB
    assert config.event_log.min_free_bytes == 100 * MIB
    assert dict(config.address_settings["#"].values) == {
        "max_size_bytes": 10 * MIB,
        "page_size_bytes": MIB,
        "max_read_page_bytes": 4 * MIB,
    }


def test_a_size_that_is_no_size_or_out_of_range_is_refused_with_file_and_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            'address-settings:\n  "#":\n    max-size-bytes: 10 MBytes\n'
            "    page-size-bytes: 4GiB\n"
            "event-log: {max-file-bytes: 0KB}\n",
            source="b.yaml",
        )
    assert [str(p) for p in caught.value.problems] == [
        'b.yaml:3: address-settings."#".max-size-bytes: not a size (an integer, or such as '
        "10MiB, 512KB, 2G): '10 MBytes'",
        f'b.yaml:4: address-settings."#".page-size-bytes: must be <= {2**31 - 1}: {4 * 1024 * MIB}',
        "b.yaml:5: event-log.max-file-bytes: must be >= 1: 0",
    ]


@pytest.mark.parametrize("key", ["max-size-messages", "max-size-bytes-reject-threshold"])
def test_keys_that_are_no_byte_sizes_still_take_integers_only(key: str) -> None:
    """As broker.xml (`is_size_key`): a count, or a key Artemis reads as a plain long, with
    a unit is not guessed at."""
    with pytest.raises(ConfigError, match=rf"{key}: not an integer: '10MB'"):
        parse_config(f'address-settings:\n  "#":\n    {key}: 10MB\n')


@pytest.mark.parametrize(
    "text", ["1" * 5000, "1" * 5000 + "MB", "\uff11\uff10MB", "\u0661\u0660", "10\u2003MB"]
)
def test_a_size_of_non_ascii_or_too_many_digits_is_no_size(text: str) -> None:
    """Eighth attack pass: `int()` took fullwidth and Arabic-Indic digits, `\\s` a
    Unicode space, and more than 4,300 digits raised ValueError out of the loader."""
    assert text_bytes(text) is None
    with pytest.raises(ConfigError, match="global-max-size: not a size"):
        parse_config(f"global-max-size: {text!r}\n")


def test_thirty_digits_are_a_size_the_range_refuses() -> None:
    with pytest.raises(ConfigError, match="global-max-size: must be <="):
        parse_config(f"global-max-size: '{'9' * 30}'\n")
