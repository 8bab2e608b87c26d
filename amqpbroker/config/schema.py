"""The broker's configuration as frozen values (CONTRACT.md "Config file (YAML)").

Keys mirror Artemis `broker.xml` element names in kebab-case; fields are the snake_case
of the key, in Artemis units. Building these objects does nothing (no files, logging or
environment): `server.py` acts on them. `load.py` is what checks values; defaults here are
the ones a missing key gets.

Keys beyond CONTRACT.md's example (all optional):

    acceptors[].amqp-treat-reject-as-unmodified-delivery-failed   false  (B-047)
    acceptors[].amqp-duplicate-detection                          true   (B-012)
    acceptors[].handshake-timeout      10     s; AMQP open due by then (<= 0: off)
    acceptors[].amqp-idle-timeout      60000  ms; Artemis amqpIdleTimeout (0 or -1: off)
    acceptors[].connections-allowed    -1     Artemis connectionsAllowed (-1: unlimited)
    acceptors[].handshakes-per-source  256    sockets of one source before its AMQP open (-1: off)
    wildcard-addresses.enabled                                    true   (B-104)
    id-cache-size                                                 20000  (B-012)
    global-max-size     -1: half the memory limit (container or machine)  (B-151)
    max-disk-usage      90     % of the data dir's file system; over it durable sends
                               are refused (-1: off; docs/decisions.md)
    disk-scan-period    5000   ms between disk-usage checks
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amqpbroker.core import (
    AddressSettings,
    QueueConfig,
    ResolvedSettings,
    RoutingType,
    WildcardConfig,
    last_value_key,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """`acceptors[].tls`: PEM files for an amqps:// acceptor (security/tls.py loads them)."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    client_auth: str = "none"  # none | optional | required


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptorConfig:
    """One `acceptors[]` entry; scheme, host and port are parsed from `url` by the loader."""

    name: str
    url: str
    scheme: str  # amqp | amqps
    host: str
    port: int  # 0: pick a free port, reported in DATA_DIR/ports.json
    anycast_prefix: str | None = None
    multicast_prefix: str | None = None
    tls: TlsConfig | None = None
    # B-047: Artemis amqpTreatRejectAsUnmodifiedDeliveryFailed
    amqp_treat_reject_as_unmodified_delivery_failed: bool = False
    amqp_duplicate_detection: bool = True  # B-012: Artemis amqpDuplicateDetection
    # B-152: the largest message (bytes) a producer may send here; 0: no limit.
    max_message_size: int = 0
    # Issue 15. Artemis handshake-timeout (s): a connection whose AMQP open has not
    # arrived by then (TLS and SASL included) is closed; <= 0 turns it off.
    handshake_timeout: int = 10
    # Artemis amqpIdleTimeout (ms; default connection-ttl 60000): the open advertises
    # half, and a peer silent for the whole of it is dropped (B-054); 0 or -1: off.
    amqp_idle_timeout: int = 60_000
    connections_allowed: int = -1  # Artemis connectionsAllowed; -1: unlimited
    # Fourth attack pass: sockets of one source (an IPv4 address, an IPv6 /64; its /48
    # 16 times as many) that have not finished the AMQP open (SASL included; on amqps,
    # from the end of the TLS handshake, which asyncio does first); a further one is
    # closed at once. Not Artemis's: where an unauthenticated peer lives,
    # and a client holds a socket there for milliseconds. -1: no bound.
    handshakes_per_source: int = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig:
    """`http`: metrics, health and management API. The file says `bind: HOST:PORT`."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8161
    # Issue 15 (slowloris): a request's head, and then its body, must arrive within this;
    # an idle keep-alive connection is closed after as long.
    read_timeout: int = 10_000  # ms
    max_connections: int = 100  # served at once (a thread each); more get a 503
    # Issue 24: how often the broker samples its queues for the console's charts and rates.
    sample_interval: int = 5_000  # ms
    analyze_report: str | None = None  # served read-only at /console/report


@dataclass(frozen=True, slots=True, kw_only=True)
class PersistenceConfig:
    """`persistence` (B-095..B-097): off means memory only."""

    enabled: bool = True
    sync: bool = True
    persist_delivery_count_before_delivery: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class EventLogConfig:
    """`event-log` (B-170): lifecycle events as JSON lines under DATA_DIR/events."""

    enabled: bool = True
    level: str = "lifecycle"  # off | failures | lifecycle
    properties: tuple[str, ...] = ()
    # false | true (SHA-256, B-170) | "keyed" (HMAC-SHA-256 with a random key kept in
    # DATA_DIR/event-log.key: payload identity for poison detection without exposing the
    # content to a dictionary attack; issue 22 item 3, docs/decisions.md).
    body_hash: bool | str = "keyed"
    max_file_bytes: int = 64 * 1024 * 1024
    max_file_age: int = 300_000  # ms
    # Retention and the disk budget (issue 17; eventlog/retention.py, docs/decisions.md).
    compress: bool = True  # rotated files become .jsonl.gz
    max_total_bytes: int | None = None  # None: min(10% of the file system, 2 GiB); -1: none
    max_age: int = 7 * 24 * 3_600_000  # ms since a file's last write; -1: no limit
    keep_until_analyzed: bool = False  # never delete a file `analyze` has not compacted
    min_free_bytes: int | None = None  # None: min(5% of the file system, 1 GiB); 0: none


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    """`metrics`: also export the Artemis Prometheus plugin names, for existing dashboards."""

    artemis_names: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class UserConfig:
    """`security.users.NAME`: a scrypt hash (`amqpbroker user hash`), never a password."""

    password_hash: str
    roles: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityConfig:
    """`security` (B-154): SASL and Artemis-style security-settings; off by default."""

    enabled: bool = False
    sasl_mechanisms: tuple[str, ...] = ("PLAIN", "EXTERNAL")
    allow_plain_without_tls: bool = False
    users: dict[str, UserConfig] = field(default_factory=dict)
    # pattern -> permission -> roles
    security_settings: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDef:
    """A configured queue: configuration-managed, never auto-deleted (B-113). An option
    left None takes its address's `default-*` setting, as Artemis applies them."""

    name: str
    durable: bool = True
    filter: str | None = None
    max_consumers: int | None = None
    purge_on_no_consumers: bool | None = None
    exclusive: bool | None = None
    group_rebalance: bool | None = None
    group_rebalance_pause_dispatch: bool | None = None
    group_buckets: int | None = None
    group_first_key: str | None = None
    consumers_before_dispatch: int | None = None
    delay_before_dispatch: int | None = None  # ms
    last_value_key: str | None = None
    last_value: bool = False
    non_destructive: bool = False
    ring_size: int = -1

    def queue_config(
        self,
        address: str,
        routing_type: RoutingType,
        *,
        defaults: ResolvedSettings,
        **flags: Any,
    ) -> QueueConfig:
        """The core's `QueueConfig` of this queue (`last-value: true` keys on
        `_AMQ_LVQ_NAME`, B-120): for configured queues and management's createQueue.
        `defaults` are the address's settings: the B-122…B-128 options this queue leaves
        unset take their `default-*` values, as Artemis applies them (B-110)."""
        options = {
            name: default if getattr(self, name) is None else getattr(self, name)
            for name, default in defaults.queue_defaults().items()
        }
        return QueueConfig(
            name=self.name,
            address=address,
            routing_type=routing_type,
            durable=self.durable,
            filter=self.filter,
            last_value_key=last_value_key(self.last_value_key, self.last_value),
            non_destructive=self.non_destructive,
            ring_size=self.ring_size,
            **options,
            **flags,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressConfig:
    """A configured address; a routing type is present when its key is (even if empty)."""

    name: str
    anycast: tuple[QueueDef, ...] = ()
    multicast: tuple[QueueDef, ...] = ()
    routing_types: frozenset[str] = frozenset()  # "ANYCAST" / "MULTICAST" keys present


DEFAULT_ACCEPTOR = AcceptorConfig(
    name="amqp", url="amqp://127.0.0.1:5672", scheme="amqp", host="127.0.0.1", port=5672
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """The whole file. `source` is where it came from (for messages only)."""

    name: str = "amqpbroker"
    data_dir: str | None = None
    acceptors: tuple[AcceptorConfig, ...] = (DEFAULT_ACCEPTOR,)
    http: HttpConfig = field(default_factory=HttpConfig)
    persistence: PersistenceConfig = field(default_factory=PersistenceConfig)
    message_expiry_scan_period: int = 30_000  # ms; -1 disables the scanner (B-084)
    address_queue_scan_period: int = 30_000  # ms (B-111)
    max_redelivery_records: int = 10  # B-096
    id_cache_size: int = 20_000  # B-012
    # B-151: bytes all queues may hold in memory before addresses count as full (PAGE:
    # to disk); -1: half the memory limit (container or machine), as Artemis takes half
    # the JVM heap. The server works it out (`store/sysmem.py`).
    global_max_size: int = -1
    # Artemis `max-disk-usage` / `disk-scan-period`: over this percent of the data
    # directory's file system durable sends are refused, so that acks, rolls and
    # compaction always have room (core/diskguard.py); -1: no check.
    max_disk_usage: int = 90
    disk_scan_period: int = 5_000  # ms
    event_log: EventLogConfig = field(default_factory=EventLogConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    wildcard_addresses: WildcardConfig = field(default_factory=WildcardConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    address_settings: dict[str, AddressSettings] = field(default_factory=dict)
    addresses: tuple[AddressConfig, ...] = ()
    source: str = "<defaults>"
