"""Address-settings: wildcard-matched, overlaid from most to least specific (B-100…B-104).

Theory of operation
-------------------
Each configured entry is an `AddressSettings` whose fields are `None` when that entry does
not set them. To resolve the settings of an address, every pattern that matches it is
taken, ordered most specific first (B-100), and each field comes from the first entry that
sets it (Artemis `mergeCopy`). Fields nobody sets take the built-in defaults of B-103,
applied once, in `resolve()`. Settings are looked up by *address* name, never by queue
name; an FQQN is resolved by its address part (B-101). Results are cached and the cache
is cleared on every change (B-102).

Field names are the Artemis config keys in snake_case, in Artemis units (ms, bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from amqpbroker.core.model import RoutingType
from amqpbroker.core.unsupported import UNSUPPORTED_SETTINGS
from amqpbroker.core.wildcard import WildcardConfig

ADDRESS_FULL_POLICIES = ("PAGE", "BLOCK", "FAIL", "DROP")
SLOW_CONSUMER_POLICIES = ("NOTIFY", "KILL")
CONFIG_DELETE_POLICIES = ("OFF", "FORCE")


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedSettings:
    """The effective settings of one address: every field has a value (B-103 defaults)."""

    dead_letter_address: str = ""  # "" = none: dead letters are dropped (B-071)
    max_delivery_attempts: int = 10  # <= 0: unlimited (B-060)
    redelivery_delay: int = 0  # ms (B-065)
    redelivery_delay_multiplier: float = 1.0
    max_redelivery_delay: int = 0  # ms; resolve() sets redelivery_delay * 10 when unset
    redelivery_collision_avoidance_factor: float = 0.0
    auto_create_dead_letter_resources: bool = False
    dead_letter_queue_prefix: str = "DLQ."
    dead_letter_queue_suffix: str = ""
    expiry_address: str = ""  # "" = none: expired messages are dropped
    expiry_delay: int = -1  # ms
    min_expiry_delay: int = -1  # ms
    max_expiry_delay: int = -1  # ms
    no_expiry: bool = False
    auto_create_expiry_resources: bool = False
    expiry_queue_prefix: str = "EXP."
    expiry_queue_suffix: str = ""
    send_to_dla_on_no_route: bool = False
    auto_create_addresses: bool = True
    auto_create_queues: bool = True
    auto_delete_addresses: bool = True
    auto_delete_addresses_delay: int = 0  # ms
    auto_delete_addresses_skip_usage_check: bool = False
    auto_delete_queues: bool = True
    auto_delete_created_queues: bool = False
    auto_delete_queues_delay: int = 0  # ms
    auto_delete_queues_message_count: int = 0
    auto_delete_queues_skip_usage_check: bool = False
    config_delete_queues: str = "OFF"
    config_delete_addresses: str = "OFF"
    default_address_routing_type: RoutingType = RoutingType.MULTICAST
    default_queue_routing_type: RoutingType = RoutingType.MULTICAST
    default_max_consumers: int = -1
    default_purge_on_no_consumers: bool = False
    default_exclusive_queue: bool = False
    default_last_value_queue: bool = False
    default_last_value_key: str = ""
    default_non_destructive: bool = False
    default_consumers_before_dispatch: int = 0
    default_delay_before_dispatch: int = -1  # ms
    default_group_rebalance: bool = False
    default_group_rebalance_pause_dispatch: bool = False
    default_group_buckets: int = -1
    default_group_first_key: str = ""
    default_ring_size: int = -1
    retroactive_message_count: int = 0
    address_full_policy: str = "PAGE"
    max_size_bytes: int = -1
    max_size_messages: int = -1
    max_size_bytes_reject_threshold: int = -1
    page_size_bytes: int = 10 * 1024 * 1024
    # B-151 PAGE: how much is read back from page files into a queue's memory at most
    # (Artemis: 2 x page-size-bytes; -1 messages: no count limit).
    max_read_page_bytes: int = 20 * 1024 * 1024
    max_read_page_messages: int = -1
    enable_metrics: bool = True
    enable_ingress_timestamp: bool = False
    management_browse_page_size: int = 200
    slow_consumer_threshold: int = -1
    slow_consumer_policy: str = "NOTIFY"
    slow_consumer_check_period: int = 5  # seconds, as Artemis
    redistribution_delay: int = -1  # ms; cluster only

    @property
    def has_expiry_overrides(self) -> bool:
        """Whether B-081 can change an expiration at this address (a hot-path shortcut)."""
        return (
            self.no_expiry
            or self.expiry_delay >= 0
            or self.min_expiry_delay >= 0
            or self.max_expiry_delay >= 0
        )

    def queue_defaults(self) -> dict[str, Any]:
        """The B-122…B-128 `QueueConfig` values the `default-*` settings give a queue on
        this address (B-110), auto-created or configured without them: the one table."""
        return {
            "max_consumers": self.default_max_consumers,
            "purge_on_no_consumers": self.default_purge_on_no_consumers,
            "exclusive": self.default_exclusive_queue,
            "group_rebalance": self.default_group_rebalance,
            "group_rebalance_pause_dispatch": self.default_group_rebalance_pause_dispatch,
            "group_buckets": self.default_group_buckets,
            "group_first_key": self.default_group_first_key or None,
            "consumers_before_dispatch": self.default_consumers_before_dispatch,
            "delay_before_dispatch": self.default_delay_before_dispatch,
        }

    def to_config(self) -> dict[str, Any]:
        """Kebab-case keys and plain values, as in the YAML file and the HTTP API; the keys
        amqpbroker does not implement (core/unsupported.py) are left out: never shown as
        effective (issue 19)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in UNSUPPORTED_SETTINGS:
                continue
            value = getattr(self, f.name)
            out[f.name.replace("_", "-")] = value.value if isinstance(value, RoutingType) else value
        return out


_DEFAULTS = ResolvedSettings()
SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ResolvedSettings))


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressSettings:
    """One address-settings entry. Unset fields (None) inherit from a broader match.

    Built from keyword arguments named like `ResolvedSettings` fields; `values` holds only
    the ones this entry sets, so an entry never hides a broader one by accident.
    """

    values: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, **values: Any) -> AddressSettings:
        unknown = set(values) - set(SETTING_NAMES)
        if unknown:
            raise TypeError(f"unknown address-settings: {sorted(unknown)}")
        return cls(values=tuple(sorted((k, v) for k, v in values.items() if v is not None)))

    def get(self, name: str) -> Any:
        for key, value in self.values:
            if key == name:
                return value
        return None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def over(self, broader: AddressSettings) -> AddressSettings:
        """This entry's values, with the ones it leaves unset taken from `broader`."""
        merged = broader.as_dict()
        merged.update(self.as_dict())
        return AddressSettings.of(**merged)


def resolve(entry: AddressSettings) -> ResolvedSettings:
    """Apply the built-in defaults once (B-103), including max-redelivery-delay = R x 10."""
    values = entry.as_dict()
    settings = replace(_DEFAULTS, **values)
    if "max_redelivery_delay" not in values:
        settings = replace(settings, max_redelivery_delay=settings.redelivery_delay * 10)
    return settings


class SettingsRepository:
    """Address-settings by match pattern, with the merge and cache of Artemis.

    Loop thread only.
    """

    def __init__(
        self,
        entries: dict[str, AddressSettings] | None = None,
        *,
        wildcards: WildcardConfig | None = None,
    ) -> None:
        self.wildcards = wildcards or WildcardConfig()
        self._entries: dict[str, AddressSettings] = {}
        self._cache: dict[str, ResolvedSettings] = {}
        self._publishing: dict[str, tuple[ResolvedSettings, bool, bool]] = {}
        # Bumped by every change (`_changed`): a copy of resolved settings kept elsewhere
        # (`Queue.settings`) is good while the version it was read at is current.
        self.version = 0
        for pattern, entry in (entries or {}).items():
            self.add(pattern, entry)

    @property
    def patterns(self) -> list[str]:
        return list(self._entries)

    def add(self, pattern: str, entry: AddressSettings) -> None:
        """Add or replace the entry for `pattern` (B-102: takes effect on next lookup)."""
        problem = self.wildcards.validate_pattern(pattern)
        if problem:
            raise ValueError(f"address-settings match {pattern!r}: {problem}")
        self._entries[pattern] = entry
        self._changed()

    def remove(self, pattern: str) -> None:
        self._entries.pop(pattern, None)
        self._changed()

    def _changed(self) -> None:
        """B-102: a change takes effect on the next lookup: the one place that drops what
        was derived from the entries, here and (by `version`) wherever it was kept."""
        self._cache.clear()
        self._publishing.clear()
        self.version += 1

    def matching(self, address: str) -> list[str]:
        """Patterns that match `address`, most specific first (B-100)."""
        wc = self.wildcards
        hits = [p for p in self._entries if p == address or wc.matches(p, address)]
        return sorted(hits, key=lambda p: (0,) if p == address else wc.specificity_key(p))

    def merged(self, address: str) -> AddressSettings:
        merged = AddressSettings()
        for pattern in reversed(self.matching(address)):
            merged = self._entries[pattern].over(merged)
        return merged

    def resolve(self, address: str) -> ResolvedSettings:
        """Effective settings for `address` (the address part of an FQQN). Cached under
        the name as given too, so the per-message lookup is one dict hit, not a split."""
        cached = self._cache.get(address)
        if cached is None:
            name = address.split("::", 1)[0]
            cached = self._cache.get(name)
            if cached is None:
                cached = resolve(self.merged(name))
                self._cache[name] = cached
            self._cache[address] = cached
        return cached

    def publishing(self, address: str) -> tuple[ResolvedSettings, bool, bool]:
        """`resolve(address)` with what publish asks of it for every message, derived once
        per change (B-102), not per message (issue 20): whether B-081 can change an
        expiration there (`has_expiry_overrides`), and whether a B-151 size limit is set
        (max-size-bytes, max-size-messages or max-size-bytes-reject-threshold)."""
        hot = self._publishing.get(address)
        if hot is None:
            settings = self.resolve(address)
            hot = (
                settings,
                settings.has_expiry_overrides,
                settings.max_size_bytes >= 0
                or settings.max_size_messages >= 0
                or settings.max_size_bytes_reject_threshold >= 0,
            )
            self._publishing[address] = hot
        return hot
