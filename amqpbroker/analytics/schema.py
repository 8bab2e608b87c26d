"""The explicit Spark schema of the lifecycle event log (B-170): no inference, ever.

Inference reads every file twice and guesses types from whatever it happens to see (a
log whose `copy_msg_id` is always null would come out as a string). The field names are
`eventlog.child.EVENT_FIELDS` (the analytics job imports no broker code); a test checks
the two stay the same list.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

CORRUPT_RECORD = "_corrupt_record"

_TYPES: dict[str, DataType] = {
    "ts": LongType(),
    "seq": LongType(),
    "event": StringType(),
    "broker": StringType(),
    "msg_id": LongType(),
    "amqp_message_id": StringType(),
    "address": StringType(),
    "queue": StringType(),
    "routing_type": StringType(),
    "durable": BooleanType(),
    "size": LongType(),
    "delivery_count": LongType(),
    "connection": StringType(),
    "link": StringType(),
    "txn": StringType(),
    "reason": StringType(),
    "target_address": StringType(),
    "target_queues": ArrayType(StringType()),
    "copy_msg_id": LongType(),
    "delay_ms": LongType(),
    "first_ts": LongType(),
    "error_condition": StringType(),
    "error_description": StringType(),
    "props": MapType(StringType(), StringType()),
    "body_hash": StringType(),
}

EVENT_SCHEMA = StructType([StructField(name, kind, nullable=True) for name, kind in _TYPES.items()])

# What the JSON reader gets: the fields plus the raw text of any line it cannot parse
# (PERMISSIVE mode), so a malformed line is counted instead of failing the job.
RAW_SCHEMA = StructType([*EVENT_SCHEMA.fields, StructField(CORRUPT_RECORD, StringType())])
