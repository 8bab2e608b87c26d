"""The event-log writer process's common line in C (`eventlog/_lines.c`, issue 20, B-170).

`_lines.lines` must give the bytes `ChildWriter._format(...).encode()` gives, and leave
the writer's caches as `_format` does, for any frame: the common lines, the rare events
it hands back to `_format`, hostile strings (peers' addresses, links, message ids: every
code point, lone surrogates, control characters), odd values a bug might send (lists,
bools, huge ints, wrong lengths), and the same exception where `_format` raises. The C
is tested in every tier: the compiled build's module, else built here from its source
(`support.cext`).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from proton import Message as ProtonMessage
from support import cext

from amqpbroker.amqp import sections
from amqpbroker.core import LifecycleEvent, RawEvent
from amqpbroker.core.lifecycle import KNOWN
from amqpbroker.eventlog import child

SOURCE = Path(child.__file__).resolve().parent / "_lines.c"


def c_lines() -> ModuleType:
    """`_lines`: the installed one, else built from SOURCE."""
    # Under its bare name, as support/framescan.py does (tests/unit/test_build.py checks
    # the package has no extension in editable installs).
    return cext.installed_or_built(
        "amqpbroker.eventlog._lines", lambda: cext.build("_lines", lambda _: [SOURCE])
    )


def new_writer(directory: Path, *, properties: tuple[str, ...] = ()) -> child.ChildWriter:
    config = {
        "directory": str(directory / "events"),
        "broker": 'b\u00e91"\\',  # escaped once, in the cached texts
        "properties": list(properties),
        "body_hash": "keyed",
        "body_key_file": str(directory / "key"),
        "max_file_bytes": 1 << 20,
        "max_file_age": 60_000,
        "min_free_bytes": None,
    }
    return child.ChildWriter(config, report=lambda: None)


def c_writer(directory: Path, **kw: Any) -> child.ChildWriter:
    return new_writer(directory, **kw)


def outcome(call: Any) -> Any:
    try:
        return call()
    except Exception as e:  # the same failure both ways is part of the contract
        return type(e)


def in_c(w: child.ChildWriter, first_seq: Any, events: Any) -> Any:
    module = c_lines()
    return outcome(
        lambda: module.lines(
            first_seq,
            events,
            w._info,
            w._messages,
            w._shapes,
            w._message_info,
            w._cache_message,
            w._cache_shape,
            w._format,
        )
    )


def in_python(w: child.ChildWriter, first_seq: Any, events: Any) -> Any:
    return outcome(lambda: w._format(first_seq, events).encode())


def state(w: child.ChildWriter) -> Any:
    return (w._info, w._messages, w.logs)


def assert_same(tmp_path: Path, frames: list[tuple[Any, Any]], **kw: Any) -> list[Any]:
    """Each frame through `_lines.c` and through `_format`, each with its own writer:
    the same bytes (or exception) frame by frame, the same caches after."""
    c = c_writer(tmp_path / "c", **kw)
    pure = new_writer(tmp_path / "pure", **kw)
    pure.body_key = c.body_key
    pure._pads = c._pads
    results = []
    for first_seq, events in frames:
        got = in_c(c, first_seq, events)
        expected = in_python(pure, first_seq, events)
        assert got == expected, (first_seq, events)
        results.append(got)
    assert state(c) == state(pure)
    return results


def encoded(**kw: Any) -> bytes:
    return sections.scan(bytes(ProtonMessage(**kw).encode())).data


def event(kind: str = "acked", **kw: Any) -> RawEvent:
    fields: dict[str, Any] = {"ts": 1, "event": kind, "msg_id": 7, "address": "a"}
    fields.update(kw)
    return LifecycleEvent(**fields).raw()


HOSTILE = [
    "",
    "plain",
    'quote" backslash\\ slash/',
    "".join(chr(c) for c in range(0x20)) + "\x7f",
    "\u00e9\u4e2d\U0001f600",
    "\ud800 lone \udfff",
    "\udbff\udc00",  # a surrogate pair as two code points
    "%s %d {} {{",
    "\u2028\u2029\ufeff\uffff",
]
ENCODABLE = [s for s in HOSTILE if not any(0xD800 <= ord(c) < 0xE000 for c in s)]  # UTF-8


def queue_frames(seed: int) -> list[tuple[int, list[Any]]]:
    """Frames of the broker's common events with hostile names and message ids, shared
    shapes (as the broker sends them), `KNOWN` parts, redelivery counts."""
    rng = random.Random(seed)
    frames: list[tuple[int, list[Any]]] = []
    seq = 1
    msg_id = 0
    for _ in range(4):
        address, queue, container, link = (rng.choice(HOSTILE) for _ in range(4))
        sent = event(
            "sent",
            address=address,
            connection=container,
            link=link,
            target_queues=(queue, rng.choice(HOSTILE)),
        )
        enq = event(
            "enqueued", address=address, queue=queue, routing_type="ANYCAST", reason="route"
        )
        disp = event("dispatched", address=address, queue=queue, connection=container, link=link)
        acked = event("acked", address=address, queue=queue, reason=rng.choice(HOSTILE))
        # A redelivery's return leg: the consumer's shape, one shared `extra` (delay 0,
        # `queue._RETURNED_AT_ONCE`) or a delay of its own.
        returned = event(
            "returned",
            address=address,
            queue=queue,
            connection=container,
            link=link,
            reason=rng.choice(["modified-failed", "released", *HOSTILE]),
            delay_ms=0,
        )
        frame: list[Any] = []
        for _ in range(rng.randrange(1, 12)):
            msg_id += 1
            ids = [*ENCODABLE, msg_id, None]
            tenant = {"tenant": rng.choice(ENCODABLE)}
            data = encoded(id=rng.choice(ids), body=b"x" * rng.randrange(50), properties=tenant)
            part = (msg_id, rng.random() < 0.5, len(data), 1000 + msg_id, data)
            known = (*part[:4], KNOWN)
            frame.append((sent[0], 10 + msg_id, part, None, sent[4]))
            frame.append((enq[0], 11 + msg_id, part, None, None))
            frame.append((disp[0], 12 + msg_id, rng.choice([part, known]), rng.randrange(3), None))
            if rng.random() < 0.5:
                delay = rng.choice([0, 0, 5, 1 << 70])
                extra = returned[4] if delay == 0 else (None,) * 4 + (delay,) + (None,) * 3
                frame.append((returned[0], 12 + msg_id, known, 1, extra))
                frame.append((disp[0], 12 + msg_id, known, 2, None))
            frame.append((acked[0], 13 + msg_id, known, None, None))
        frames.append((seq, frame))
        seq += len(frame)
    return frames


@pytest.mark.parametrize("seed", range(8))
def test_the_c_lines_are_format_s_bytes_for_hostile_names(tmp_path: Path, seed: int) -> None:
    """Every code point of a peer's address, container, link or message id is escaped as
    `_format` escapes it (the texts are made once, in Python), and an allow-listed
    application property's value: byte for byte."""
    properties = ("tenant",) if seed % 2 else ()
    results = assert_same(tmp_path, queue_frames(seed), properties=properties)
    assert all(isinstance(r, bytes) and r for r in results)


def test_the_c_lines_hand_every_rare_event_to_format(tmp_path: Path) -> None:
    """Transactions, dead letters, events without a message, every event type: the
    generic line, the same bytes."""
    data = encoded(id="m", body=b"b", properties={"tenant": "t1"})
    frame: list[Any] = [
        event("acked", txn="tx\u00e9"),
        event(
            "dead-lettered",
            reason="rejected",
            target_address="DLA",
            copy_msg_id=9,
            error_condition=sections.Symbol("app:poison"),
            error_description="x" * 600,
            delivery_count=2,
            data=data,
            size=len(data),
        ),
        event("expired", delay_ms=5, data=data, size=len(data)),
        event("sent", target_queues=("a",), txn="t", data=data, size=len(data)),
        event("enqueued", data=None),
        event("sent", target_queues=("a", "\ud800"), data=data, size=len(data)),
    ]
    assert_same(tmp_path, [(1, frame), (7, list(reversed(frame)))], properties=("tenant",))


def test_the_c_lines_write_a_redelivery_s_returned_line_themselves(tmp_path: Path) -> None:
    """Issue 20: a consumer's `returned` (its extra only a delay, shared at 0 as
    `queue._RETURNED_AT_ONCE` is) is a common line, not `_format`'s: a redelivery's
    fifth line cost the writer process a Python call and the 24-field template."""
    returned = event("returned", queue="q", link="l", reason="modified-failed", delay_ms=0)
    delayed = (*returned[:4], (None, None, None, None, 250, None, None, None))
    data = encoded(id="m", body=b"b")
    frame = [
        (returned[0], 5, (1, False, len(data), 3, data), 1, returned[4]),
        (returned[0], 6, (1, False, len(data), 3, KNOWN), 2, returned[4]),
        (delayed[0], 7, (1, False, len(data), 3, KNOWN), 3, delayed[4]),
    ]
    w = c_writer(tmp_path)
    calls: list[Any] = []

    def fallback(first_seq: Any, events: Any) -> str:
        calls.append(events)
        return w._format(first_seq, events)

    module = c_lines()
    got = module.lines(
        1,
        frame,
        w._info,
        w._messages,
        w._shapes,
        w._message_info,
        w._cache_message,
        w._cache_shape,
        fallback,
    )
    assert calls == []
    pure = new_writer(tmp_path / "pure")
    pure.body_key, pure._pads = w.body_key, w._pads
    assert got == "".join(pure._line(s, *e) for s, e in enumerate(frame, 1)).encode()
    assert b'"delay_ms":0,' in got
    assert b'"delay_ms":250,' in got


K = ("k", ("a", "q", "ANYCAST"), None, None)  # a shape
NOT8 = (None, None, ("q",), None, None, None, None, None, 9)  # a `sent`'s extra of nine
DELAY = (None, None, None, None)  # a `returned`'s extra up to its delay_ms
ODD: list[Any] = [
    [("s",), 1, (1, False, 1, 1, b"\0Sw"), None, None],  # a list, not a tuple
    ("only", "four", "items", None),
    (None, 1, [1, False, 1, 1, b""], None, None),  # the part a list
    (None, 1, (1, False, 1, 1), None, None),  # a part of four
    (K, True, (2, True, 3, 4, KNOWN), False, None),
    (K, 1 << 70, (1 << 80, 1, -5, -(1 << 64), 5), 1.5, None),
    (K, -(1 << 63), (3, 0, 0, 0, KNOWN), -1, None),
    (K, "\ud800", (4, 0, 0, 0, KNOWN), None, None),
    (K, 1, (5, 0, 0, 0, KNOWN), "\udc00", None),
    (K, 1, (6, 0, 0, 0, KNOWN), None, (None,) * 9),
    (K, 1, (7, 0, 0, 0, KNOWN), None, [None] * 8),
    (K, 1, (8, 0, 0, 0, KNOWN), None, NOT8),
    (K, 1, (9, 0, 0, 0, KNOWN), None, (None, None, ["unhashable"], *(None,) * 5)),
    (K, 1, (12, 0, 0, 0, KNOWN), 1, (*DELAY, True, None, None, None)),  # not an exact int
    (K, 1, (13, 0, 0, 0, KNOWN), 1, (*DELAY, 1.0, None, None, None)),
    (K, 1, (14, 0, 0, 0, KNOWN), 1, (*DELAY, -(1 << 80), None, None, None)),
    (K, 1, (15, 0, 0, 0, KNOWN), 1, (*DELAY, 0, None, None, None, None)),  # nine
    (K, 1, (16, 0, 0, 0, KNOWN), 1, ("tx", None, None, None, 0, None, None, None)),
    (K, 1, (17, 0, 0, 0, KNOWN), 1, (None, None, ("q",), None, 0, None, None, None)),
    (K, 1, (18, 0, 0, 0, KNOWN), 1, (*DELAY, 0, None, None, "id")),
    ((["unhashable"], ("a", "q", "ANYCAST"), None, None), 1, (10, 0, 0, 0, KNOWN), None, None),
    (K, 1, ("id", 0, 0, 0, b"not amqp"), None, None),
    (K, 1, (11, 0, 0, 0, 3.5), None, None),
    None,
    7,
]


@pytest.mark.parametrize("index", range(len(ODD)))
def test_the_c_lines_give_format_s_text_or_exception_for_any_value(
    tmp_path: Path, index: int
) -> None:
    """A value a bug might send: `_format`'s text for it, or its exception type; never a
    crash, and the frame's other events as `_format` writes them."""
    good = event("acked", queue="q", msg_id=1)
    assert_same(tmp_path, [(1, [good, ODD[index], good]), (4, [ODD[index]])])


@pytest.mark.parametrize(
    "first_seq", [0, -3, (1 << 62) - 1, 1 << 62, 1 << 63, 1 << 100, -(1 << 70), True, 2.0, "1"]
)
def test_the_c_lines_number_from_any_first_seq(tmp_path: Path, first_seq: Any) -> None:
    """Sequence numbers beyond a C long long go through `_format` whole: the same text."""
    frame = [event("acked", queue="q", msg_id=1), event("acked", queue="q", msg_id=2)]
    assert_same(tmp_path, [(first_seq, frame)])


def test_the_c_lines_refuse_what_is_not_a_frame(tmp_path: Path) -> None:
    """Not a list of events: `_format`'s outcome; caches of the wrong type: TypeError."""
    assert_same(tmp_path, [(1, (event(),)), (1, None), (1, "events")])
    w = c_writer(tmp_path)
    module = c_lines()
    with pytest.raises(TypeError):
        module.lines(1, [], [], w._messages, w._shapes, None, None, None, None)
    with pytest.raises(TypeError):
        module.lines(1, [])


def test_the_c_lines_survive_callbacks_that_clear_the_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text caches are cleared whole when full (`_TEXT_CACHE`, `_JSON_CACHE`), maybe
    by the callback the C is in: its references stay valid, the lines the same."""
    monkeypatch.setattr(child, "_TEXT_CACHE", 2)
    monkeypatch.setattr(child, "_JSON_CACHE", 2)
    for seed in range(3):
        assert_same(tmp_path / str(seed), queue_frames(seed))


@pytest.mark.parametrize("seed", range(30))
def test_the_c_lines_match_format_on_random_frames(tmp_path: Path, seed: int) -> None:
    """Random mixes of common, rare and odd events, shapes shared and not, the same
    message's bytes again after its texts were cached: byte for byte, frame by frame."""
    rng = random.Random(seed)
    pool = [e for _, frame in queue_frames(seed) for e in frame]
    pool += [e for e in ODD if isinstance(e, tuple) and len(e) == 5]
    frames = []
    seq = rng.randrange(1, 1 << 40)
    for _ in range(5):
        frame = [rng.choice(pool) for _ in range(rng.randrange(0, 40))]
        frames.append((seq, frame))
        seq += len(frame)
    assert_same(tmp_path, frames)


def test_the_writer_process_uses_the_c_lines_exactly_when_built() -> None:
    """The compiled build has `_lines` (setup.py C_MODULES) and the writer process uses
    it; editable installs run `_format` (issue 20)."""
    compiled = os.environ.get("AMQPBROKER_COMPILED") == "1"
    assert (child._c_lines is not None) == compiled
    assert isinstance(c_lines().keep_memory(), bool)


def test_a_writer_with_the_c_lines_writes_format_s_file(tmp_path: Path) -> None:
    """Through `write_frames` (the process's path), with and without the C: the same
    file, byte for byte."""
    files = []
    for way in ("c", "python"):
        w = new_writer(tmp_path / way)
        w.body_key = b"k" * 32
        w._pads = child.hmac_pads(w.body_key)
        saved = child._c_lines
        child._c_lines = c_lines().lines if way == "c" else None
        try:
            w.write_frames([(s, 1, f) for s, f in queue_frames(3)])
            w._rotate()
        finally:
            child._c_lines = saved
        (path,) = (tmp_path / way / "events").glob("*.jsonl")
        files.append(path.read_bytes())
    assert files[0] == files[1]
    assert files[0].count(b"\n") == sum(len(f) for _, f in queue_frames(3))
