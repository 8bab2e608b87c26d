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
