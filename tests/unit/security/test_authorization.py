"""security-settings use the same matcher and specificity as address-settings (B-100)."""

from __future__ import annotations

import itertools

import pytest

from amqpbroker.core import AddressSettings, NotAuthorized, SettingsRepository
from amqpbroker.core.security import SecurityRepository

PATTERNS = ["#", "orders.#", "orders.*", "orders.eu", "*.eu", "orders.*.vip", "a.b.#"]
ADDRESSES = [
    "orders",
    "orders.eu",
    "orders.us",
    "orders.eu.vip",
    "x.eu",
    "a.b",
    "a.b.c.d",
    "other",
    "orders::q",
]


@pytest.mark.parametrize("address", ADDRESSES)
def test_most_specific_match_is_the_same_as_for_address_settings(address: str) -> None:
    """The entry that decides a permission is the first of SettingsRepository.matching."""
    security = SecurityRepository({p: {"send": (p,)} for p in PATTERNS})
    settings = SettingsRepository(
        {p: AddressSettings.of(max_delivery_attempts=1) for p in PATTERNS}
    )
    expected = settings.matching(address.split("::")[0])[0]
    assert security.entry(address) == {"send": (expected,)}


@pytest.mark.parametrize(
    ("roles", "address", "permission", "allowed"),
    [
        (frozenset({"ops"}), "orders.eu", "send", True),
        (frozenset({"ops"}), "orders.eu", "consume", False),  # most specific entry decides
        (frozenset({"ops"}), "payments", "consume", True),
        (frozenset(), "payments", "consume", False),
        (None, "anything", "manage", True),  # security disabled
    ],
)
def test_allowed(
    roles: frozenset[str] | None, address: str, permission: str, allowed: bool
) -> None:
    security = SecurityRepository(
        {
            "#": {"send": ("ops",), "consume": ("ops",)},
            "orders.#": {"send": ("ops",)},
        }
    )
    assert security.allowed(roles, permission, address) is allowed


def test_refusal_names_the_permission_not_other_addresses() -> None:
    security = SecurityRepository({"secret.#": {"send": ("admin",)}})
    with pytest.raises(NotAuthorized) as info:
        security.require(frozenset({"guest"}), "send", "secret.plans", user="guest")
    assert str(info.value) == "user guest does not have permission 'send' on address secret.plans"
    assert info.value.condition == "amqp:unauthorized-access"


def test_every_permission_can_be_granted_separately() -> None:
    from amqpbroker.core.security import PERMISSIONS

    for granted, asked in itertools.product(sorted(PERMISSIONS), repeat=2):
        security = SecurityRepository({"#": {granted: ("r",)}})
        assert security.allowed(frozenset({"r"}), asked, "q") is (granted == asked)


WILDCARD_GRANTS = {
    "#": {"consume": ("admin",)},
    "a.*": {"consume": ("app",)},
    "b.#": {"consume": ("app", "admin")},
    "b.secret": {"consume": ("admin",)},
    "activemq.management": {"browse": ("app",), "manage": ("admin",)},
}


@pytest.mark.parametrize(
    ("role", "pattern", "allowed"),
    [
        ("app", "a.#", False),  # a.x.secret is decided by "#": admin only
        ("app", "a.*", True),  # every a.<word> is decided by "a.*"
        ("admin", "a.*", False),  # nor is admin granted a.<word> (most specific decides)
        ("app", "b.#", False),  # b.secret is admin's alone
        ("app", "b.*.x", True),  # no b.secret among them
        ("admin", "b.#", True),  # "b.#" and "b.secret" decide there: both grant admin
        ("app", "#", False),
        ("admin", "c.#", True),  # only "#" decides there (the management address is never routed)
        ("app", "a.*::q", True),  # the FQQN's queue part is not the address
    ],
)
def test_a_wildcard_subscription_needs_the_permission_on_every_address_it_names(
    role: str, pattern: str, allowed: bool
) -> None:
    """Issue 15 attack, B-154: a wildcard pattern was looked up as one literal address, so
    `a.#` took the entry of `a.*` (its `*` matching the word `#`): a user allowed to consume
    `a.*` subscribed to `a.#` and received `a.x.secret`, granted to admin only. Now each
    entry that decides for some address the pattern names must grant it."""
    security = SecurityRepository(WILDCARD_GRANTS)
    assert security.allowed(frozenset({role}), "consume", pattern) is allowed


def test_wildcard_subscriptions_agree_with_every_address_they_name() -> None:
    """The pattern check against brute force: a pattern is allowed exactly when every
    concrete address of up to 3 words from a small alphabet it matches is allowed (no
    pattern here matches only longer ones)."""
    from amqpbroker.core.wildcard import WildcardConfig

    wc = WildcardConfig()
    security = SecurityRepository(WILDCARD_GRANTS)
    words = ["a", "b", "x", "secret"]
    addresses = [".".join(p) for n in (1, 2, 3) for p in itertools.product(words, repeat=n)]
    patterns = [
        ".".join(p)
        for n in (1, 2, 3)
        for p in itertools.product([*words, "*", "#"], repeat=n)
        if "#" not in p[:-1]
    ]
    for role in ("app", "admin"):
        roles = frozenset({role})
        for pattern in patterns:
            if not wc.has_wildcard(pattern):
                continue
            named = [a for a in addresses if wc.matches(pattern, a)]
            every = all(security.allowed(roles, "consume", a) for a in named)
            if security.allowed(roles, "consume", pattern):
                assert every, (role, pattern)
