"""Metric names: `amqpbroker_` prefix, base units, counters end in `_total` (added by
prometheus-client), modelled on Artemis QueueMetricNames (CONTRACT.md "Metrics")."""

QUEUE_MESSAGES = "amqpbroker_queue_messages"
QUEUE_DELIVERING = "amqpbroker_queue_delivering_messages"
QUEUE_SCHEDULED = "amqpbroker_queue_scheduled_messages"
QUEUE_CONSUMERS = "amqpbroker_queue_consumers"
QUEUE_ADDED = "amqpbroker_queue_messages_added"  # _total
QUEUE_ACKNOWLEDGED = "amqpbroker_queue_messages_acknowledged"  # _total
QUEUE_EXPIRED = "amqpbroker_queue_messages_expired"  # _total
QUEUE_DEAD_LETTERED = "amqpbroker_queue_messages_dead_lettered"  # _total{reason}
QUEUE_KILLED = "amqpbroker_queue_messages_killed"  # _total{reason}
QUEUE_RETURNED = "amqpbroker_queue_deliveries_returned"  # _total{outcome}
ADDRESS_ROUTED = "amqpbroker_address_routed_messages"  # _total
ADDRESS_UNROUTED = "amqpbroker_address_unrouted_messages"  # _total
CONNECTIONS = "amqpbroker_connections"
CONNECTIONS_OPENED = "amqpbroker_connections_opened"  # _total
JOURNAL_SYNC_SECONDS = "amqpbroker_journal_sync_seconds"  # histogram
JOURNAL_SIZE_BYTES = "amqpbroker_journal_size_bytes"
EVENT_LOG_DROPPED = "amqpbroker_event_log_dropped"  # _total
AUTHENTICATION_FAILURES = "amqpbroker_authentication_failures"  # _total
# _total{reason}: connections-allowed, file-descriptors, handshake-timeout (issue 15)
CONNECTIONS_REFUSED = "amqpbroker_connections_refused"
BUILD_INFO = "amqpbroker_build_info"

# The ActiveMQ Artemis Prometheus plugin names (metrics.artemis-names: true).
ARTEMIS = {
    "messages": "artemis_message_count",
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
}
