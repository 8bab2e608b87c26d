"""The broker itself: pure, synchronous, sans-I/O (STYLE.md section 3).

Only the standard library is imported here; adapters call `Broker` and apply its effects.
"""

from amqpbroker.core.attach import (
    ConsumerAttached,
    ConsumerRequest,
    ProducerRequest,
)
from amqpbroker.core.broker import Broker
from amqpbroker.core.clock import Clock, ManualClock, SystemClock
from amqpbroker.core.dispatch import dispatch_options
from amqpbroker.core.effects import (
    AddressUnblocked,
    CloseConnection,
    CloseConsumer,
    Dispatch,
    Drained,
    Effect,
)
from amqpbroker.core.errors import (
    BrokerError,
    ClientError,
    IllegalState,
    InvalidSelector,
    MaxConsumersReached,
    NotAuthorized,
    NotFound,
    ResourceLimitExceeded,
)
from amqpbroker.core.lifecycle import (
    EVENT_TYPES,
    FAILURE_EVENTS,
    NO_DATA_LIMIT,
    EventLevel,
    LifecycleEvent,
    RawEvent,
)
from amqpbroker.core.model import (
    DEFAULT_PRIORITY,
    DUPLICATE_ID,
    ConnectionId,
    ConsumerId,
    DeliveryId,
    Message,
    ProducerTarget,
    QueueConfig,
    RoutingType,
    SectionReader,
    annotated_routing_type,
)
from amqpbroker.core.moves import (
    MessageCopier,
    MoveAnnotations,
    kept_annotations,
    move_annotation_values,
)
from amqpbroker.core.outcomes import (
    ACCEPTED,
    FAILED,
    RELEASED,
    Accepted,
    Modified,
    Outcome,
    Rejected,
    Released,
)
from amqpbroker.core.queue import Queue, Window
from amqpbroker.core.queuekinds import last_value_key
from amqpbroker.core.settings import AddressSettings, ResolvedSettings, SettingsRepository
from amqpbroker.core.wildcard import WildcardConfig

__all__ = [
    "ACCEPTED",
    "DEFAULT_PRIORITY",
    "DUPLICATE_ID",
    "EVENT_TYPES",
    "FAILED",
    "FAILURE_EVENTS",
    "NO_DATA_LIMIT",
    "RELEASED",
    "Accepted",
    "AddressSettings",
    "AddressUnblocked",
    "Broker",
    "BrokerError",
    "ClientError",
    "Clock",
    "CloseConnection",
    "CloseConsumer",
    "ConnectionId",
    "ConsumerAttached",
    "ConsumerId",
    "ConsumerRequest",
    "DeliveryId",
    "Dispatch",
    "Drained",
    "Effect",
    "EventLevel",
    "IllegalState",
    "InvalidSelector",
    "LifecycleEvent",
    "ManualClock",
    "MaxConsumersReached",
    "Message",
    "MessageCopier",
    "Modified",
    "MoveAnnotations",
    "NotAuthorized",
    "NotFound",
    "Outcome",
    "ProducerRequest",
    "ProducerTarget",
    "Queue",
    "QueueConfig",
    "RawEvent",
    "Rejected",
    "Released",
    "ResolvedSettings",
    "ResourceLimitExceeded",
    "RoutingType",
    "SectionReader",
    "SettingsRepository",
    "SystemClock",
    "WildcardConfig",
    "Window",
    "annotated_routing_type",
    "dispatch_options",
    "kept_annotations",
    "last_value_key",
    "move_annotation_values",
]
