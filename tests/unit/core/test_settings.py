"""Wildcard matching and the address-settings overlay (B-011, B-100…B-104)."""

from __future__ import annotations

import pytest

from amqpbroker.core import AddressSettings, SettingsRepository, WildcardConfig

WC = WildcardConfig()


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        ("#", "orders", True),
        ("#", "a.b.c", True),
        ("a.#", "a", True),  # B-100: a.# also matches a itself
        ("a.#", "a.b.c", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.*", "a", False),
        ("my.*", "myqueue", False),  # B-101: word-wise
        ("a.*.c", "a.b.c", True),
        ("a.b", "a.b", True),
        ("a.b", "a.bc", False),
        ("*.b.#", "x.b", True),
    ],
)
def test_wildcard_matching_is_word_wise(pattern: str, address: str, expected: bool) -> None:
    """B-011/B-101: '*' one word, '#' zero or more words, whole words only."""
    assert WC.matches(pattern, address) is expected


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("a..b", "an empty word (two '.' together): did you mean 'a.b'?"),
        ("orders..#", "an empty word (two '.' together): did you mean 'orders.#'?"),
        (".a", "an empty word (a leading '.'): did you mean 'a'?"),
        ("a.*.", "an empty word (a trailing '.'): did you mean 'a.*'?"),
        ("..", "an empty word (a leading '.')"),
    ],
)
def test_a_pattern_has_no_empty_words(pattern: str, problem: str) -> None:
    """A pattern with an empty word matches only addresses with one, never what the
    typo meant (Artemis takes it silently): refused, with the pattern it likely meant;
    also when added at runtime (B-102)."""
    assert WC.validate_pattern(pattern) == problem
    with pytest.raises(ValueError, match="empty word"):
        SettingsRepository({pattern: AddressSettings.of(max_delivery_attempts=1)})


def test_an_empty_word_is_judged_with_the_configured_delimiter() -> None:
    """`wildcard-addresses.delimiter` decides what an empty word is (B-104)."""
    slash = WildcardConfig(delimiter="/")
    assert slash.validate_pattern("a..b") is None  # one word, with dots in it
    assert slash.validate_pattern("a//b") == "an empty word (two '/' together): did you mean 'a/b'?"


@pytest.mark.parametrize("pattern", ["a.#.b", "#.a", "a#", "a.b#"])
def test_any_words_only_as_last_word(pattern: str) -> None:
    """B-101: '#' anywhere but the last word is a configuration error."""
    assert WC.validate_pattern(pattern) is not None
    with pytest.raises(ValueError, match="last word"):
        SettingsRepository({pattern: AddressSettings.of(max_delivery_attempts=1)})


@pytest.mark.parametrize(
    ("patterns", "address", "expected_order"),
    [
        (["#", "a.b", "a.#"], "a.b", ["a.b", "a.#", "#"]),  # literal beats wildcard
        (["#", "a.#", "a.b.#"], "a.b.c", ["a.b.#", "a.#", "#"]),  # longer '#' wins
        (["a.#", "a.*"], "a.b", ["a.*", "a.#"]),  # no '#' beats '#'
        (["*.b", "a.*"], "a.b", ["a.*", "*.b"]),  # literal word beats '*' from the left
        (["a.*.*", "a.b.*"], "a.b.c", ["a.b.*", "a.*.*"]),
    ],
)
def test_matches_are_ordered_most_specific_first(
    patterns: list[str], address: str, expected_order: list[str]
) -> None:
    """B-100 specificity order (Artemis MatchComparator)."""
    repo = SettingsRepository({p: AddressSettings.of(max_delivery_attempts=1) for p in patterns})
    assert repo.matching(address) == expected_order


def test_fields_overlay_from_most_specific() -> None:
    """B-100: each field comes from the most specific pattern that sets it."""
    repo = SettingsRepository(
        {
            "#": AddressSettings.of(dead_letter_address="DLA", max_delivery_attempts=5),
            "orders.#": AddressSettings.of(max_delivery_attempts=3, redelivery_delay=100),
            "orders.eu": AddressSettings.of(redelivery_delay=7),
        }
    )
    eu = repo.resolve("orders.eu")
    assert (eu.dead_letter_address, eu.max_delivery_attempts, eu.redelivery_delay) == ("DLA", 3, 7)
    us = repo.resolve("orders.us")
    assert (us.max_delivery_attempts, us.redelivery_delay) == (3, 100)
    other = repo.resolve("payments")
    assert (other.max_delivery_attempts, other.redelivery_delay) == (5, 0)


def test_builtin_defaults_apply_once() -> None:
    """B-103: no DLA, 10 attempts, no delay, MULTICAST; max-redelivery-delay = R x 10."""
    repo = SettingsRepository({"x": AddressSettings.of(redelivery_delay=250)})
    plain = repo.resolve("anything")
    assert plain.dead_letter_address == ""
    assert plain.max_delivery_attempts == 10
    assert plain.redelivery_delay == 0
    assert plain.default_address_routing_type.value == "MULTICAST"
    assert repo.resolve("x").max_redelivery_delay == 2500


def test_fqqn_resolves_by_address_part() -> None:
    """B-006/B-101: settings of `a::q` are those of address `a`."""
    repo = SettingsRepository({"a": AddressSettings.of(max_delivery_attempts=2)})
    assert repo.resolve("a::q").max_delivery_attempts == 2


def test_runtime_change_takes_effect_on_next_lookup() -> None:
    """B-102: the cache is cleared when settings change."""
    repo = SettingsRepository({"#": AddressSettings.of(max_delivery_attempts=4)})
    assert repo.resolve("q").max_delivery_attempts == 4
    repo.add("q", AddressSettings.of(max_delivery_attempts=9))
    assert repo.resolve("q").max_delivery_attempts == 9
    repo.remove("q")
    assert repo.resolve("q").max_delivery_attempts == 4


def test_a_cached_fqqn_follows_a_runtime_change_of_its_address() -> None:
    """B-101/B-102: an FQQN's settings are cached under the name as given (issue 20: one
    dict hit per message); a change of its address's settings clears that entry too."""
    repo = SettingsRepository({"#": AddressSettings.of(max_delivery_attempts=4)})
    assert repo.resolve("a::q").max_delivery_attempts == 4
    assert repo.resolve("a::q") is repo.resolve("a")
    repo.add("a", AddressSettings.of(max_delivery_attempts=9))
    assert repo.resolve("a::q").max_delivery_attempts == 9
    repo.remove("a")
    assert repo.resolve("a::q").max_delivery_attempts == 4


def test_the_publish_flags_follow_a_runtime_change() -> None:
    """B-102 for what publish derives once per address (issue 20): B-081 overrides and
    the B-151 size limits are re-derived after a change, on the next message."""
    repo = SettingsRepository({"#": AddressSettings.of(max_delivery_attempts=4)})
    settings, expiry_overrides, size_limited = repo.publishing("a")
    assert (settings, expiry_overrides, size_limited) == (repo.resolve("a"), False, False)
    repo.add("a", AddressSettings.of(expiry_delay=1000, max_size_bytes_reject_threshold=10))
    assert repo.publishing("a")[1:] == (True, True)
    repo.remove("a")
    assert repo.publishing("a")[1:] == (False, False)
