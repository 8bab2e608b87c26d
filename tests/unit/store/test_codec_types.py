"""Eighth attack pass (B-095, B-153): whatever a journal record decodes to has the field
types its class declares, or it is a decode error. A crc vouches only for the bytes
being what was written; a record written by hand, or damage the crc did not see, may
hold a value of any tag in any field, and recovery handed such values on (an address
name that was bytes: a TypeError traceback at start)."""

from __future__ import annotations

import dataclasses
import os
import typing

import pytest

from amqpbroker.core.model import QueueConfig, RoutingType
from amqpbroker.core.records import RECORD_CLASSES, AddQueue, Record
from amqpbroker.store import codec

AMQPBROKER_COMPILED = os.environ.get("AMQPBROKER_COMPILED") == "1"

SAMPLES: dict[type[typing.Any], Record] = {
    cls: cls(**kwargs)  # type: ignore[misc]
    for cls, kwargs in (
        (RECORD_CLASSES[t], k)
        for t, k in {
            45: {"msg_id": 1, "address": "a", "data": b"d"},
            32: {"queue": "q", "msg_id": 1},
            33: {"queue": "q", "msg_id": 1},
            34: {"queue": "q", "msg_id": 1, "delivery_count": 2},
            36: {"queue": "q", "msg_id": 1, "at_ms": 5},
            21: {"name": "q", "address": "a", "routing_type": RoutingType.ANYCAST},
            101: {"name": "q"},
            44: {"name": "a", "routing_types": (RoutingType.MULTICAST,)},
            102: {"name": "a"},
            103: {"queue": "q", "page": 1, "offset": 2},
            104: {"queue": "q", "page": 1, "offsets": (1, 2)},
            17: {"txn_id": 1},
            18: {"txn_id": 1},
            19: {"txn_id": 1},
        }.items()
    )
}
OTHERS = [None, True, 7, -1, "s", b"b", 1.5, ("x",), (b"y", 1), {"k": b"v"}, {1: 2}]


def _declared(record: Record) -> None:
    hints = typing.get_type_hints(type(record))
    for field in dataclasses.fields(record):
        assert codec._conforms(getattr(record, field.name), hints[field.name]), field.name


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda cls: cls.__name__)
def test_every_field_of_another_type_is_a_decode_error_or_of_its_type(cls: type) -> None:
    sample = SAMPLES[cls]
    assert codec.decode(sample.type_id, codec.encode(sample)) == sample
    for index in range(len(dataclasses.fields(sample))):
        for value in OTHERS:
            values = [getattr(sample, f.name) for f in dataclasses.fields(sample)]
            values[index] = value
            parts = [bytes((len(values),))]
            for item in values:
                codec._encode_value(parts, item)
            try:
                record = codec.decode(sample.type_id, b"".join(parts))
            except codec.CodecError:
                continue
            _declared(record)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"ring_size": "10"}, "extra 'ring_size' is a str"),
        ({"exclusive": 1}, "extra 'exclusive' is a int"),
        ({"last_value_key": b"k"}, "extra 'last_value_key' is a bytes"),
        ({"extra": ["x"]}, "extra 'extra' is a tuple"),
        ({"name": "other"}, "extra repeats the field 'name'"),
        ({"routing_type": "ANYCAST"}, "extra repeats the field 'routing_type'"),
    ],
)
def test_an_add_queue_whose_extra_would_not_make_a_queue_config_is_a_decode_error(
    extra: dict[str, typing.Any], problem: str
) -> None:
    """`recovery._queue_config` passes `extra`'s QueueConfig fields as keywords: a repeated
    one was a TypeError, a mistyped one a queue that failed at its first message."""
    record = AddQueue(name="q", address="a", routing_type=RoutingType.ANYCAST, extra=extra)
    with pytest.raises(codec.CodecError, match=problem):
        codec.decode(record.type_id, codec.encode(record))


def test_an_add_queue_as_the_broker_writes_it_decodes() -> None:
    config = QueueConfig(
        name="q", address="a", routing_type=RoutingType.ANYCAST, ring_size=5, exclusive=True
    )
    extra = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(QueueConfig)
        if f.name not in codec._ADD_QUEUE_OWN and f.name != "extra"
    }
    extra["extra"] = {"x-custom": 1}
    record = AddQueue(name="q", address="a", routing_type=RoutingType.ANYCAST, extra=extra)
    assert codec.decode(record.type_id, codec.encode(record)) == record


def test_a_union_hint_the_compiled_build_erased_is_checked_by_building_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B-095, eighth attack pass: mypyc keeps a compiled class's `str | None` as `type` at
    run time; such a hint accepts the value and the settings are built once instead
    (the compiled QueueConfig refuses a wrong type there; the pure one has real hints)."""
    from amqpbroker.store import codec

    assert codec._conforms(None, type)
    assert codec._conforms("k", type)
    assert codec._queue_extra_problem({"last_value_key": None, "ring_size": 5}) is None
    problem = codec._queue_extra_problem({"ring_size": "5"})
    assert problem is not None
    assert "ring_size" in problem
    hints = dict(codec._QUEUE_HINTS)
    hints["last_value_key"] = type  # as the compiled build's annotations read
    monkeypatch.setattr(codec, "_QUEUE_HINTS", hints)
    assert codec._queue_extra_problem({"last_value_key": None}) is None
    if AMQPBROKER_COMPILED:  # only the native class checks a field's type when built
        problem = codec._queue_extra_problem({"last_value_key": b"k"})
        assert problem is not None
        assert problem.startswith("extra 'last_value_key' is a bytes")
