"""The Spark schema is the event log's (B-170). That real broker lines parse field for
field is checked on a real run in test_broker_pipeline.py."""

from __future__ import annotations

import pytest

from amqpbroker.analytics.schema import CORRUPT_RECORD, EVENT_SCHEMA, RAW_SCHEMA
from amqpbroker.eventlog.child import EVENT_FIELDS

pytestmark = pytest.mark.spark


def test_schema_fields_are_the_event_log_fields() -> None:
    """STYLE section 7: the JSONL fields and the Spark schema are one list."""
    assert EVENT_SCHEMA.fieldNames() == list(EVENT_FIELDS)
    assert RAW_SCHEMA.fieldNames() == [*EVENT_FIELDS, CORRUPT_RECORD]
