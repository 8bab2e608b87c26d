"""Authorization: `security-settings` by address pattern (B-154, Artemis security-settings).

Patterns use the same wildcard engine and specificity order as address-settings (B-100).
As in Artemis, the most specific matching entry decides on its own (its role lists are not
merged with broader entries): a permission that entry does not grant to any of the
user's roles is refused. No matching entry means no permission.
"""

from __future__ import annotations

from collections.abc import Mapping

from amqpbroker.core.errors import NotAuthorized
from amqpbroker.core.wildcard import WildcardConfig

PERMISSIONS = frozenset(
    {
        "send",
        "consume",
        "browse",
        "create-address",
        "delete-address",
        "create-durable-queue",
        "delete-durable-queue",
        "create-non-durable-queue",
        "delete-non-durable-queue",
        "manage",
    }
)


class SecurityRepository:
    """Who may do what where. Roles None means security is disabled: everything allowed."""

    def __init__(
        self,
        settings: Mapping[str, Mapping[str, tuple[str, ...]]],
        *,
        wildcards: WildcardConfig | None = None,
    ) -> None:
        self.wildcards = wildcards or WildcardConfig()
        self._settings = {pattern: dict(perms) for pattern, perms in settings.items()}
        self._cache: dict[str, dict[str, tuple[str, ...]]] = {}

    def entry(self, address: str) -> dict[str, tuple[str, ...]]:
        """The permissions of the most specific pattern matching `address`."""
        address = address.split("::", 1)[0]
        cached = self._cache.get(address)
        if cached is None:
            wc = self.wildcards
            hits = [p for p in self._settings if p == address or wc.matches(p, address)]
            hits.sort(key=lambda p: (0,) if p == address else wc.specificity_key(p))
            cached = self._settings[hits[0]] if hits else {}
            self._cache[address] = cached
        return cached

    def allowed(self, roles: frozenset[str] | None, permission: str, address: str) -> bool:
        if roles is None:
            return True
        return any(role in roles for role in self.entry(address).get(permission, ()))

    def require(
        self,
        roles: frozenset[str] | None,
        permission: str,
        address: str,
        *,
        user: str | None = None,
    ) -> None:
        """Raise NotAuthorized naming the permission (never other addresses)."""
        if not self.allowed(roles, permission, address):
            who = f"user {user}" if user else "this user"
            raise NotAuthorized(
                f"{who} does not have permission '{permission}' on address {address}"
            )
