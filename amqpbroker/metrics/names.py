"""Metric names: `amqpbroker_` prefix, base units, counters end in `_total` (added by
prometheus-client), modelled on Artemis QueueMetricNames (CONTRACT.md "Metrics")."""

QUEUE_MESSAGES = "amqpbroker_queue_messages"
QUEUE_DELIVERING = "amqpbroker_queue_delivering_messages"
QUEUE_SCHEDULED = "amqpbroker_queue_scheduled_messages"
QUEUE_CONSUMERS = "amqpbroker_queue_consumers"
QUEUE_GROUPS = "amqpbroker_queue_groups"  # message groups with an owner (B-127)
QUEUE_OLDEST_AGE = "amqpbroker_queue_oldest_message_age_seconds"  # issue 24
QUEUE_ADDED = "amqpbroker_queue_messages_added"  # _total
QUEUE_ACKNOWLEDGED = "amqpbroker_queue_messages_acknowledged"  # _total
QUEUE_EXPIRED = "amqpbroker_queue_messages_expired"  # _total
QUEUE_DEAD_LETTERED = "amqpbroker_queue_messages_dead_lettered"  # _total{reason}
QUEUE_KILLED = "amqpbroker_queue_messages_killed"  # _total{reason}
QUEUE_RETURNED = "amqpbroker_queue_deliveries_returned"  # _total{outcome}
QUEUE_REPLACED = "amqpbroker_queue_messages_replaced"  # _total{reason}: ring, last-value
ADDRESS_ROUTED = "amqpbroker_address_routed_messages"  # _total
ADDRESS_UNROUTED = "amqpbroker_address_unrouted_messages"  # _total
# B-151 PAGE (issue 23): what the page files of an address's queues hold.
ADDRESS_PAGED_BYTES = "amqpbroker_address_paged_bytes"
ADDRESS_PAGED_MESSAGES = "amqpbroker_address_paged_messages"
ADDRESS_PAGE_FILES = "amqpbroker_address_page_files"
# _total: paged messages lost to damaged page files (counted and logged, across queue
# incarnations as the counters below; docs/decisions.md, h-pagefix)
ADDRESS_PAGED_LOST = "amqpbroker_address_paged_messages_lost"
# The queue counters summed per address, kept across queue (and address) incarnations, so
# an auto-deleted queue that comes back does not restart them (issue 16 item 4).
ADDRESS_ADDED = "amqpbroker_address_messages_added"  # _total
ADDRESS_ACKNOWLEDGED = "amqpbroker_address_messages_acknowledged"  # _total
ADDRESS_EXPIRED = "amqpbroker_address_messages_expired"  # _total
ADDRESS_DEAD_LETTERED = "amqpbroker_address_messages_dead_lettered"  # _total{reason}
ADDRESS_KILLED = "amqpbroker_address_messages_killed"  # _total{reason}
# Broker-wide, never reset while the broker runs.
MESSAGES_DEAD_LETTERED = "amqpbroker_messages_dead_lettered"  # _total{reason}
MESSAGES_EXPIRED = "amqpbroker_messages_expired"  # _total
MESSAGES_KILLED = "amqpbroker_messages_killed"  # _total{reason}
CONNECTIONS = "amqpbroker_connections"
CONNECTIONS_OPENED = "amqpbroker_connections_opened"  # _total
JOURNAL_SYNC_SECONDS = "amqpbroker_journal_sync_seconds"  # histogram
JOURNAL_SIZE_BYTES = "amqpbroker_journal_size_bytes"
JOURNAL_FAILED = "amqpbroker_journal_failed"  # 1 while the journal refuses appends
JOURNAL_ERRORS = "amqpbroker_journal_errors"  # _total: write, sync, roll, retry errors
# Artemis max-disk-usage (core/diskguard.py): the data directory's file system.
DISK_USAGE_RATIO = "amqpbroker_disk_usage_ratio"  # used / total at the last check
DISK_FULL = "amqpbroker_disk_full"  # 1 while over max-disk-usage (durable sends refused)
EVENT_LOG_DROPPED = "amqpbroker_event_log_dropped"  # _total
EVENT_LOG_PENDING = "amqpbroker_event_log_pending_events"
# The event log's disk budget (issue 17): what its files hold, and what retention deleted.
EVENT_LOG_DISK_BYTES = "amqpbroker_event_log_disk_bytes"
EVENT_LOG_FILES = "amqpbroker_event_log_files"
EVENT_LOG_OLDEST_FILE_AGE = "amqpbroker_event_log_oldest_file_age_seconds"
EVENT_LOG_FILES_DELETED = "amqpbroker_event_log_files_deleted"  # _total{compacted}
EVENT_LOG_DELETED_BYTES = "amqpbroker_event_log_deleted_bytes"  # _total{compacted}
AUTHENTICATION_FAILURES = "amqpbroker_authentication_failures"  # _total
# _total{reason}: connections-allowed, file-descriptors, handshake-timeout (issue 15),
# handshakes-per-source (fourth attack pass)
CONNECTIONS_REFUSED = "amqpbroker_connections_refused"
# _total{policy}: consumers found slow (slow-consumer-threshold; NOTIFY or KILL, issue 19)
SLOW_CONSUMERS = "amqpbroker_slow_consumers"
BUILD_INFO = "amqpbroker_build_info"

# The ActiveMQ Artemis Prometheus plugin names (metrics.artemis-names: true): those whose
# meaning this broker has, with help text saying what Artemis means by them (QueueControl,
# AddressControl, BrokerMetricNames). The ones that cannot apply, and why, are listed in
# docker/README.md ("Artemis metric names").
ARTEMIS = {
    "messages": "artemis_message_count",
    "persistent_size": "artemis_persistent_size",
    "added": "artemis_messages_added",
    "killed": "artemis_messages_killed",
    "expired": "artemis_messages_expired",
    "acknowledged": "artemis_messages_acknowledged",
    "delivering": "artemis_delivering_message_count",
    "scheduled": "artemis_scheduled_message_count",
    "consumers": "artemis_consumer_count",
    "routed": "artemis_routed_message_count",
    "unrouted": "artemis_unrouted_message_count",
    "connections": "artemis_connection_count",
    "total_connections": "artemis_total_connection_count",
}
ARTEMIS_HELP = {
    "messages": "Messages in this queue now, scheduled and in-delivery ones included.",
    "persistent_size": "Encoded size in bytes of the messages in this queue now, durable or"
    " not, scheduled, in-delivery and paged ones included.",
    "added": "Messages added to this queue since it was created.",
    "killed": "Messages removed from this queue since it was created because they exceeded"
    " the max delivery attempts.",
    "expired": "Messages expired from this queue since it was created.",
    "acknowledged": "Messages acknowledged from this queue since it was created.",
    "delivering": "Messages this queue is delivering to its consumers now.",
    "scheduled": "Scheduled messages in this queue.",
    "consumers": "Consumers receiving from this queue.",
    "routed": "Messages routed to one or more queues of this address.",
    "unrouted": "Messages sent to this address that no queue took.",
    "connections": "Clients connected to this broker now.",
    "total_connections": "Clients that connected to this broker since it started.",
}
