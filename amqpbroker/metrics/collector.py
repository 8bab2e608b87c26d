"""A Prometheus collector over an immutable snapshot of the broker.

The snapshot is taken on the event-loop thread (`BrokerSnapshot.take`), so a scrape never
reads core state from the HTTP thread and never locks anything per message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

import amqpbroker.metrics.names as names
from amqpbroker import __version__
from amqpbroker.core import Broker
from amqpbroker.core.operations import QueueStats, queue_stats
from amqpbroker.core.queue import QueueCounters

SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def journal_sync_histogram() -> Histogram:
    """Journal fsync (group commit) durations, observed on the journal's writer thread;
    not registered anywhere: `BrokerSnapshot` carries what it collects."""
    return Histogram(
        names.JOURNAL_SYNC_SECONDS,
        "Journal fsync (group commit) durations.",
        buckets=SYNC_BUCKETS,
        registry=None,
    )


@dataclass(frozen=True, slots=True)
class AddressStats:
    name: str
    routed: int
    unrouted: int


@dataclass(frozen=True, slots=True)
class EventLogFiles:
    """The event log's files as its writer process last reported them (issue 17)."""

    disk_bytes: int = 0
    files: int = 0
    oldest_mtime_ms: int | None = None  # the oldest file's last write, epoch ms
    deleted_files: int = 0
    deleted_bytes: int = 0
    deleted_uncompacted_files: int = 0  # never compacted by `amqpbroker analyze`
    deleted_uncompacted_bytes: int = 0


@dataclass(frozen=True, slots=True)
class BrokerSnapshot:
    """Everything a scrape reports, copied at one instant on the loop thread."""

    broker: str
    queues: tuple[QueueStats, ...]
    addresses: tuple[AddressStats, ...]
    connections: int
    connections_opened: int
    event_log_dropped: int
    authentication_failures: int = 0
    event_log_pending: int = 0  # handed to the writer process, not yet written or dropped
    journal_size_bytes: int = 0
    journal_sync: tuple[Metric, ...] = ()
    event_log_files: EventLogFiles | None = None  # None: no event log
    taken_ms: int = 0  # epoch ms, for the oldest event file's age
    journal_failed: bool = False
    journal_errors: int = 0
    # Copies made for this snapshot: per address across incarnations, and broker-wide.
    address_totals: tuple[tuple[str, QueueCounters], ...] = ()
    broker_totals: QueueCounters = field(default_factory=QueueCounters)
    connections_refused: tuple[tuple[str, int], ...] = ()  # (reason, total)
    slow_consumers: tuple[tuple[str, int], ...] = ()  # (policy, total)
    # (used / total, over max-disk-usage) at the last check; None: no check (-1, or no
    # persistence).
    disk: tuple[float, bool] | None = None

    @classmethod
    def take(
        cls,
        broker: Broker,
        *,
        connections: int,
        connections_opened: int,
        event_log_dropped: int = 0,
        event_log_pending: int = 0,
        authentication_failures: int = 0,
        journal_size_bytes: int = 0,
        journal_sync: Histogram | None = None,
        event_log_files: EventLogFiles | None = None,
        now_ms: int = 0,
        journal_failed: bool = False,
        journal_errors: int = 0,
        connections_refused: dict[str, int] | None = None,
    ) -> BrokerSnapshot:
        per_address, everything = broker.totals.totals(broker.queues.values())

        def metered(address: str) -> bool:
            """Artemis `enable-metrics`: false leaves the address and its queues out of
            the per-address and per-queue metrics (broker-wide totals still count them)."""
            return broker.settings.resolve(address).enable_metrics

        return cls(
            broker=broker.name,
            queues=tuple(q for q in queue_stats(broker) if metered(q.address)),
            addresses=tuple(
                AddressStats(a.name, a.routed, a.unrouted)
                for a in broker.post_office.addresses.values()
                if metered(a.name)
            ),
            connections=connections,
            connections_opened=connections_opened,
            event_log_dropped=event_log_dropped,
            event_log_pending=event_log_pending,
            authentication_failures=authentication_failures,
            journal_size_bytes=journal_size_bytes,
            journal_sync=tuple(journal_sync.collect()) if journal_sync is not None else (),
            event_log_files=event_log_files,
            taken_ms=now_ms,
            journal_failed=journal_failed,
            journal_errors=journal_errors,
            address_totals=tuple(i for i in per_address.items() if metered(i[0])),
            broker_totals=everything,
            connections_refused=tuple(sorted((connections_refused or {}).items())),
            slow_consumers=tuple(sorted(broker.stats.slow_consumers.items())),
            disk=(guard.ratio, guard.full) if (guard := broker.disk_guard) else None,
        )


class BrokerCollector:
    """Yields the CONTRACT metrics (and the Artemis names when asked) from a snapshot."""

    def __init__(self, snapshot: Callable[[], BrokerSnapshot], *, artemis_names: bool) -> None:
        self._snapshot = snapshot
        self._artemis = artemis_names

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        ql = ["address", "queue"]

        def queue_gauge(
            name: str, doc: str, value: Callable[[QueueStats], int], *, with_type: bool = False
        ) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=[*ql, "routing_type"] if with_type else ql)
            for q in s.queues:
                labels = [q.address, q.name] + ([q.routing_type] if with_type else [])
                family.add_metric(labels, value(q))
            return family

        def queue_counter(
            name: str, doc: str, value: Callable[[QueueStats], int]
        ) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=ql)
            for q in s.queues:
                family.add_metric([q.address, q.name], value(q))
            return family

        def by_reason(
            name: str,
            doc: str,
            label: str,
            value: Callable[[QueueStats], tuple[tuple[str, int], ...]],
        ) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=[*ql, label])
            for q in s.queues:
                for reason, count in value(q):
                    family.add_metric([q.address, q.name, reason], count)
            return family

        yield queue_gauge(
            names.QUEUE_MESSAGES,
            "Messages in the queue: ready + scheduled + delivering (+ paged); without the"
            " delivering ones on last-value and non-destructive queues (B-120, B-123).",
            lambda q: q.messages,
            with_type=True,
        )
        yield queue_gauge(
            names.QUEUE_DELIVERING, "Messages sent to consumers, unsettled.", lambda q: q.delivering
        )
        yield queue_gauge(
            names.QUEUE_SCHEDULED, "Messages waiting for a redelivery delay.", lambda q: q.scheduled
        )
        yield queue_gauge(names.QUEUE_CONSUMERS, "Consumers attached.", lambda q: q.consumers)
        yield queue_gauge(
            names.QUEUE_GROUPS, "Message groups with an owning consumer.", lambda q: q.groups
        )
        oldest = GaugeMetricFamily(
            names.QUEUE_OLDEST_AGE,
            "Age of the oldest waiting message (since the broker first accepted it); "
            "0 when none waits.",
            labels=ql,
        )
        for q in s.queues:
            age = 0.0 if q.oldest_ts is None else max(0, s.taken_ms - q.oldest_ts) / 1000
            oldest.add_metric([q.address, q.name], age)
        yield oldest
        yield queue_counter(names.QUEUE_ADDED, "Messages added to the queue.", lambda q: q.added)
        yield queue_counter(
            names.QUEUE_ACKNOWLEDGED, "Messages acknowledged (accepted).", lambda q: q.acknowledged
        )
        yield queue_counter(names.QUEUE_EXPIRED, "Messages expired.", lambda q: q.expired)
        yield by_reason(
            names.QUEUE_DEAD_LETTERED,
            "Messages moved to the dead-letter address, by reason.",
            "reason",
            lambda q: q.dead_lettered_by_reason,
        )
        yield by_reason(
            names.QUEUE_KILLED,
            "Messages removed without a copy, by reason.",
            "reason",
            lambda q: q.killed_by_reason,
        )
        yield by_reason(
            names.QUEUE_REPLACED,
            "Messages a ring or last-value queue removed, by reason (B-120, B-121).",
            "reason",
            lambda q: q.replaced_by_reason,
        )
        yield by_reason(
            names.QUEUE_RETURNED,
            "Deliveries returned to the queue, by outcome.",
            "outcome",
            lambda q: q.returned_by_reason,
        )
        yield from _address_totals(s)
        yield from _broker_totals(s.broker_totals)
        routed = CounterMetricFamily(
            names.ADDRESS_ROUTED, "Messages routed to at least one queue.", labels=["address"]
        )
        unrouted = CounterMetricFamily(
            names.ADDRESS_UNROUTED, "Messages no queue took.", labels=["address"]
        )
        for a in s.addresses:
            routed.add_metric([a.name], a.routed)
            unrouted.add_metric([a.name], a.unrouted)
        yield routed
        yield unrouted
        yield from _paging(s)
        yield GaugeMetricFamily(names.CONNECTIONS, "Open AMQP connections.", value=s.connections)
        yield CounterMetricFamily(
            names.CONNECTIONS_OPENED, "AMQP connections opened.", value=s.connections_opened
        )
        yield CounterMetricFamily(
            names.EVENT_LOG_DROPPED, "Lifecycle events dropped.", value=s.event_log_dropped
        )
        yield GaugeMetricFamily(
            names.EVENT_LOG_PENDING,
            "Lifecycle events handed to the event-log writer process and not yet written.",
            value=s.event_log_pending,
        )
        if s.event_log_files is not None:
            yield from _event_log_files(s.event_log_files, s.taken_ms)
        yield CounterMetricFamily(
            names.AUTHENTICATION_FAILURES,
            "SASL authentications refused.",
            value=s.authentication_failures,
        )
        yield _by_label(
            names.CONNECTIONS_REFUSED,
            "AMQP connections closed by a limit (connections-allowed, descriptors, handshake).",
            "reason",
            s.connections_refused,
        )
        yield _by_label(
            names.SLOW_CONSUMERS,
            "Consumers found slow (slow-consumer-threshold), by slow-consumer-policy.",
            "policy",
            s.slow_consumers,
        )
        yield from s.journal_sync
        yield GaugeMetricFamily(
            names.JOURNAL_SIZE_BYTES, "Bytes the journal holds on disk.", value=s.journal_size_bytes
        )
        yield GaugeMetricFamily(
            names.JOURNAL_FAILED,
            "1 while the journal cannot write (durable sends are refused), else 0.",
            value=int(s.journal_failed),
        )
        yield CounterMetricFamily(
            names.JOURNAL_ERRORS, "Journal write, sync and retry errors.", value=s.journal_errors
        )
        if s.disk is not None:
            yield GaugeMetricFamily(
                names.DISK_USAGE_RATIO,
                "Used / total of the data directory's file system at the last check.",
                value=s.disk[0],
            )
            yield GaugeMetricFamily(
                names.DISK_FULL,
                "1 while over max-disk-usage (durable sends are refused), else 0.",
                value=int(s.disk[1]),
            )
        info = GaugeMetricFamily(names.BUILD_INFO, "Build information.", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        if self._artemis:
            yield from self._artemis_metrics(s)

    @staticmethod
    def _artemis_metrics(s: BrokerSnapshot) -> Iterator[Metric]:
        """The Artemis Prometheus plugin names, so existing dashboards work unchanged."""
        a, help_ = names.ARTEMIS, names.ARTEMIS_HELP
        labels = ["broker", "address", "queue"]
        fields = (
            ("messages", "messages"),
            ("persistent_size", "size_bytes"),
            ("added", "added"),
            ("killed", "killed"),
            ("expired", "expired"),
            ("acknowledged", "acknowledged"),
            ("delivering", "delivering"),
            ("scheduled", "scheduled"),
            ("consumers", "consumers"),
        )
        for key, attr in fields:
            family = GaugeMetricFamily(a[key], help_[key], labels=labels)
            for q in s.queues:
                value = getattr(q, attr)
                if key == "persistent_size":  # Artemis counts its paged part too, as the
                    value += q.paged_bytes  # message count does (issue 23 audit)
                family.add_metric([s.broker, q.address, q.name], value)
            yield family
        for key, attr in (("routed", "routed"), ("unrouted", "unrouted")):
            family = GaugeMetricFamily(a[key], help_[key], labels=["broker", "address"])
            for addr in s.addresses:
                family.add_metric([s.broker, addr.name], getattr(addr, attr))
            yield family
        for key, value in (
            ("connections", s.connections),
            ("total_connections", s.connections_opened),
        ):
            family = GaugeMetricFamily(a[key], help_[key], labels=["broker"])
            family.add_metric([s.broker], value)
            yield family


def _event_log_files(f: EventLogFiles, now_ms: int) -> Iterator[Metric]:
    """Disk usage and retention of the event log (issue 17); `compacted="false"`
    deletions lost events that `amqpbroker analyze` never read."""
    yield GaugeMetricFamily(
        names.EVENT_LOG_DISK_BYTES, "Bytes the event log's files hold.", value=f.disk_bytes
    )
    yield GaugeMetricFamily(names.EVENT_LOG_FILES, "Event log files on disk.", value=f.files)
    age = 0.0 if f.oldest_mtime_ms is None else max(0, now_ms - f.oldest_mtime_ms) / 1000
    yield GaugeMetricFamily(
        names.EVENT_LOG_OLDEST_FILE_AGE, "Age of the oldest event log file's last write.", value=age
    )
    deleted = CounterMetricFamily(
        names.EVENT_LOG_FILES_DELETED, "Event log files deleted by retention.", labels=["compacted"]
    )
    deleted_bytes = CounterMetricFamily(
        names.EVENT_LOG_DELETED_BYTES,
        "Bytes of event log files deleted by retention.",
        labels=["compacted"],
    )
    uncompacted = (f.deleted_uncompacted_files, f.deleted_uncompacted_bytes)
    deleted.add_metric(["true"], f.deleted_files - uncompacted[0])
    deleted.add_metric(["false"], uncompacted[0])
    deleted_bytes.add_metric(["true"], f.deleted_bytes - uncompacted[1])
    deleted_bytes.add_metric(["false"], uncompacted[1])
    yield deleted
    yield deleted_bytes


def _paging(s: BrokerSnapshot) -> Iterator[Metric]:
    """B-151 PAGE: page files per address (its queues' summed), 0 when not paging."""
    families = (
        (names.ADDRESS_PAGED_BYTES, "Bytes of messages in page files."),
        (names.ADDRESS_PAGED_MESSAGES, "Messages in page files."),
        (names.ADDRESS_PAGE_FILES, "Page files on disk."),
    )
    sums: dict[str, list[int]] = {a.name: [0, 0, 0] for a in s.addresses}
    for q in s.queues:
        row = sums.setdefault(q.address, [0, 0, 0])
        row[0] += q.paged_bytes
        row[1] += q.paged_messages
        row[2] += q.page_files
    for i, (name, help_text) in enumerate(families):
        gauge = GaugeMetricFamily(name, help_text, labels=["address"])
        for address, row in sums.items():
            gauge.add_metric([address], row[i])
        yield gauge


def _address_totals(s: BrokerSnapshot) -> Iterator[Metric]:
    """The queue counters per address, continued across queue incarnations."""
    plain = (
        (names.ADDRESS_ADDED, "Messages added to the address's queues.", "added"),
        (names.ADDRESS_ACKNOWLEDGED, "Messages acknowledged from them.", "acknowledged"),
        (names.ADDRESS_EXPIRED, "Messages expired from them.", "expired"),
        (
            names.ADDRESS_PAGED_LOST,
            "Paged messages lost to damaged page files (B-151; logged).",
            "paged_lost",
        ),
    )
    for name, doc, attr in plain:
        family = CounterMetricFamily(name, doc, labels=["address"])
        for address, counters in s.address_totals:
            family.add_metric([address], getattr(counters, attr))
        yield family
    labelled = (
        (names.ADDRESS_DEAD_LETTERED, "Messages dead-lettered from them.", "dead_lettered"),
        (names.ADDRESS_KILLED, "Messages removed from them without a copy.", "killed"),
    )
    for name, doc, attr in labelled:
        family = CounterMetricFamily(name, doc + " By reason.", labels=["address", "reason"])
        for address, counters in s.address_totals:
            for reason, count in getattr(counters, f"{attr}_by_reason").items():
                family.add_metric([address, reason], count)
        yield family


def _by_label(
    name: str, documentation: str, label: str, totals: tuple[tuple[str, int], ...]
) -> CounterMetricFamily:
    """A broker-wide counter with one label: one series per (value, total)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, total in totals:
        family.add_metric([value], total)
    return family


def _broker_totals(totals: QueueCounters) -> Iterator[Metric]:
    """Broker-wide: never reset while the broker runs, whatever queues come and go."""
    dead = CounterMetricFamily(
        names.MESSAGES_DEAD_LETTERED, "Messages dead-lettered, by reason.", labels=["reason"]
    )
    for reason, count in totals.dead_lettered_by_reason.items():
        dead.add_metric([reason], count)
    yield dead
    yield CounterMetricFamily(names.MESSAGES_EXPIRED, "Messages expired.", value=totals.expired)
    killed = CounterMetricFamily(
        names.MESSAGES_KILLED, "Messages removed without a copy, by reason.", labels=["reason"]
    )
    for reason, count in totals.killed_by_reason.items():
        killed.add_metric([reason], count)
    yield killed


def render(collector: BrokerCollector) -> bytes:
    """The Prometheus text exposition of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return bytes(generate_latest(registry))
