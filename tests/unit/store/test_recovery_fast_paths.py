"""Issue 23 item 4 ("Recovery is fast"): the fast paths of opening and recovery give what
the general ones give.

The open indexes an AddMessage by its id and reads its body only if the message is still
live when its segment has been read; the index is compared with `JournalState.of` of
every record (the model) on random journals. Recovery restores each run of one queue's
references in one call (`Broker.restore_many`); it is compared with `Broker.restore` one
reference at a time (B-095 counts, B-015/B-065 scheduled, B-080 expiry, priorities).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from random import Random
from typing import Any

import pytest
from proton import Message as ProtonMessage
from support.core_harness import Harness
from support.framescan import framescan

from amqpbroker.amqp import sections
from amqpbroker.core import AddressSettings
from amqpbroker.core.model import Message, RoutingType
from amqpbroker.core.records import (
    AckRef,
    AddAddress,
    AddMessage,
    AddQueue,
    AddRef,
    DeleteQueue,
    PageCursor,
    Record,
    RecordType,
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.protocol import message_of
from amqpbroker.store import FileJournal, codec, frames, opening
from amqpbroker.store import segments as segment_format
from amqpbroker.store.journal import JournalState
from amqpbroker.store.locs import _SLOT_MASK, PACK_SHIFT, Run, _Pack, pack_view, pair_queue
from amqpbroker.store.recovery import _message, recover

QUEUES = ("q", "r", "s")


def _open(directory: Path, **kw: Any) -> FileJournal:
    return FileJournal(directory, fsync=lambda fd: None, auto_compact=False, **kw)


@contextlib.contextmanager
def _opening_pair(tmp_path: Path) -> Iterator[tuple[FileJournal, FileJournal, Any, Any]]:
    """Two empty journals as the open leaves them, for a batch indexed by the fast path
    (`plain`, its kept-live map and last segment) and by the two rules (`rules`)."""
    plain, rules = _open(tmp_path / "plain"), _open(tmp_path / "rules")
    try:
        for journal in (plain, rules):
            journal._opened_live = {}
        assert plain._opened_live is not None
        seg = plain._segments[-1]
        seg.packs.append(_Pack(len(plain._packs), seg))  # as the open makes one
        plain._packs.append(seg.packs[-1])
        yield plain, rules, plain._opened_live, seg
    finally:
        plain.close()
        rules.close()


def _random_appends(rng: Random, count: int) -> list[list[Record]]:
    """Appends as a broker makes them: messages with their references, acks (most soon
    after, some much later), counts, schedules, a queue deleted and made again."""
    appends: list[list[Record]] = [
        [AddQueue(name=q, address=q, routing_type=RoutingType.ANYCAST) for q in QUEUES]
    ]
    live: list[tuple[str, int]] = []
    for msg_id in range(1, count + 1):
        if rng.random() < 0.05 and msg_id > 2:
            msg_id = rng.randrange(1, msg_id)
        data = bytes([msg_id % 251]) * rng.randrange(0, 300)
        records: list[Record] = [
            AddMessage(
                msg_id=msg_id,
                address="q",
                data=data,
                priority=rng.randrange(10),
                expiration_ms=rng.choice([0, 0, 5_000]),
                first_ts=msg_id,
                header_end=0,
            )
        ]
        for queue in rng.sample(QUEUES, rng.choice([1, 1, 2])):
            records.append(AddRef(queue=queue, msg_id=msg_id))
            live.append((queue, msg_id))
        for _ in range(rng.choice([0, 1, 1, 2])):
            if not live:
                break
            roll = rng.random()
            queue, other = live[rng.randrange(len(live))]
            if roll < 0.6:
                live.remove((queue, other))
                records.append(AckRef(queue=queue, msg_id=other))
            elif roll < 0.8:
                records.append(
                    UpdateDeliveryCount(queue=queue, msg_id=other, delivery_count=rng.randrange(5))
                )
            else:
                records.append(ScheduledDelivery(queue=queue, msg_id=other, at_ms=msg_id))
        if rng.random() < 0.01:
            records.append(DeleteQueue(name="s"))
            records.append(AddQueue(name="s", address="s", routing_type=RoutingType.ANYCAST))
            live = [ref for ref in live if ref[0] != "s"]
        if rng.random() < 0.02:
            records.append(PageCursor(queue="r", page=msg_id, offset=1))
            records.append(AddAddress(name=f"a{msg_id % 3}", routing_types=(RoutingType.ANYCAST,)))
        appends.append(records)
    return appends


def _assert_same_state(state: JournalState, model: JournalState) -> None:
    assert state.addresses == model.addresses
    assert state.queues == model.queues
    assert state.page_cursors == model.page_cursors
    assert state.messages == model.messages
    assert state.refs() == model.refs()
    for queue in QUEUES:
        assert state.ref_rows(queue) == [tuple(vars_of(r)) for r in model.refs(queue)]
    assert state.max_msg_id == model.max_msg_id


def vars_of(ref: Any) -> tuple[str, int, int, int]:
    return (ref.queue, ref.msg_id, ref.delivery_count, ref.scheduled_at_ms)


def _written(tmp_path: Path, rng: Random) -> tuple[list[list[Record]], JournalState]:
    """A random journal written to `tmp_path` over segments of a random size: its appends
    and the state they make."""
    appends = _random_appends(rng, 400)
    with _open(tmp_path, max_segment_bytes=rng.choice([2048, 8192, 1 << 20])) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    return appends, JournalState.of(record for records in appends for record in records)


@pytest.mark.parametrize("step", [opening._STEP, 600])
@pytest.mark.parametrize("way", ["c", "loop"])
@pytest.mark.parametrize("seed", range(12))
def test_the_open_index_gives_the_state_of_every_record(
    tmp_path: Path, seed: int, way: str, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random journals over small segments (messages die in their own segment, in a later
    one, or live on): `state()` from the open's index equals the model, and only the
    messages still live at the end of their segment had their body read; with the open's
    bulk reader in C (`_framescan`) and without; a segment read whole, and in steps of
    600 bytes (issue 23, ninth pass: frames cross a step's end, some are longer)."""
    monkeypatch.setattr(frames, "_scan", framescan().scan if way == "c" else None)
    monkeypatch.setattr(opening, "_STEP", step)
    rng = Random(seed)
    appends, model = _written(tmp_path, rng)
    read: list[int] = []
    real = opening.read_unread  # (patched where the open calls it: compiled, `frames`
    # calls the codec natively, and a patch of `codec` would not be seen)

    def counting(
        data: bytes, unread: list[Any], keep: dict[Any, Any], pack: Any, budget: int
    ) -> int:
        for item in unread:  # a `_Loc`'s layout in `keep`, a packed one's in its pack
            layout = pack.kept.get(item & _SLOT_MASK) if isinstance(item, int) else keep.get(item)
            if isinstance(layout, tuple):
                read.append(layout[0])
        return real(data, unread, keep, pack, budget)

    monkeypatch.setattr(opening, "read_unread", counting)
    with _open(tmp_path) as journal:
        _assert_same_state(journal.state(), model)
    added = sum(isinstance(r, AddMessage) for records in appends for r in records)
    assert set(model.messages) <= set(read)
    assert len(read) < added  # the messages acked in their own segment were never read
    with FileJournal(tmp_path, read_only=True) as files:  # replay reads the files
        _assert_same_state(JournalState.of(files.replay()), model)


@pytest.mark.parametrize("way", ["c", "loop"])
@pytest.mark.parametrize("seed", range(6))
def test_a_message_past_the_body_budget_is_only_its_references_rows(
    tmp_path: Path, seed: int, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23, ninth and tenth passes: opened with a body budget, a message the open
    left in its file is no entry of `stored_messages()` (no object kept of it) but its
    body size in each of its references' rows (`ref_arrays`) or runs of the compact
    index (`ref_parts`), with its pack's earliest expiration; its first_ts and its own
    expiration are read from the file; the rows equal the model's references, the rest
    of the messages are the model's."""
    monkeypatch.setattr(frames, "_scan", framescan().scan if way == "c" else None)
    rng = Random(seed)
    _, model = _written(tmp_path, rng)
    expected = model.messages
    with _open(tmp_path, body_budget=rng.randrange(0, 20_000)) as journal:
        state = journal.state()
        stored = state.stored_messages()
        with pytest.raises(ValueError, match="body budget"):
            state.messages  # noqa: B018 (the bodies are not all here)
        rows: list[tuple[str, int, int, int]] = []
        bodiless: set[int] = set()
        in_runs = {
            msg_id
            for _, parts in state.ref_parts()
            for part in parts
            if isinstance(part, Run)
            for msg_id in pack_view(part.pack)[0][part.start : part.end]
        }
        for msg_id in in_runs:  # what the pack does not keep is in the file
            row = journal.read_message(msg_id)
            assert row is not None
            assert (row[5], row[4]) == (expected[msg_id].first_ts, expected[msg_id].expiration_ms)
        for queue, out in state.ref_arrays():
            for i in range(0, len(out), 6):
                msg_id, count, at_ms, size, first_ts, expiration_ms = out[i : i + 6]
                rows.append((queue, msg_id, count, at_ms))
                if size >= 0:
                    assert msg_id not in stored
                    bodiless.add(msg_id)
                    record = expected[msg_id]
                    assert size == len(record.data)
                    # (its first_ts is read from the file; its expiration is its pack's
                    # earliest: early at worst)
                    assert first_ts == 0
                    if record.expiration_ms:
                        assert 0 < expiration_ms <= record.expiration_ms
                else:
                    assert msg_id in stored
        assert rows == [vars_of(r) for r in model.refs()]
        assert state.ref_rows() == rows
        assert set(stored) | bodiless == set(expected)
        assert bodiless  # (the budget is below what the journal holds)


@pytest.mark.parametrize("seed", range(6))
def test_records_applied_to_a_state_from_the_index_give_the_models_state(
    tmp_path: Path, seed: int
) -> None:
    """The state from the index holds resolved rows, not the index's slots: records
    applied to it afterwards (acks, counts, schedules, re-adds, a queue deleted) give what
    applying them to the model gives."""
    rng = Random(seed)
    appends = _random_appends(rng, 300)
    head, tail = appends[:200], appends[200:]
    with _open(tmp_path, max_segment_bytes=4096) as journal:
        for records in head:
            journal.append(records, sync=False)
        journal.flush()
    model = JournalState.of(record for records in head for record in records)
    with _open(tmp_path) as journal:
        state = journal.state()
    for records in tail:
        for record in records:
            state.apply(record)
            model.apply(record)
    _assert_same_state(state, model)


def test_a_dead_message_is_dropped_from_the_open_state_when_it_dies(tmp_path: Path) -> None:
    """A message acked in a later segment was read with its segment, then let go as the
    ack was indexed: the state keeps no record of it, and counts it nowhere."""
    with _open(tmp_path, max_segment_bytes=512) as journal:
        for msg_id in (1, 2):
            journal.append(
                [
                    AddMessage(msg_id=msg_id, address="q", data=b"x" * 300),
                    AddRef(queue="q", msg_id=msg_id),
                ],
                sync=False,
            )
        journal.append([AckRef(queue="q", msg_id=1)], sync=False)
        journal.flush()
        assert journal.segment_count == 2  # message 1 in the first, its ack in the second
    with _open(tmp_path) as journal:
        kept = _opened_records(journal)
        # (a live message is kept as its row: `codec.MessageRow`, 10 fields)
        assert [r[0] for r in kept.values() if isinstance(r, tuple) and len(r) == 10] == [2]
        state = journal.state()
    assert list(state.messages) == [2]
    assert state.ref_rows() == [("q", 2, 0, 0)]


@pytest.mark.parametrize("way", ["c", "loop"])
def test_an_add_message_of_an_older_journal_opens_on_the_fast_path(
    tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment written before issue 23 (AddMessage with 7 fields, no scan) and one with
    an AddMessage only the general decoder reads (a field of another type) both open:
    the on-disk format did not change (the C reader stops at both: the loop reads them)."""
    monkeypatch.setattr(frames, "_scan", framescan().scan if way == "c" else None)
    new = AddMessage(msg_id=1, address="q", data=b"one", first_ts=4, header_end=0)
    old = AddMessage(msg_id=2, address="q", data=b"two", first_ts=5)
    odd = AddMessage(msg_id=3, address="q", data=b"three", priority=True)  # type: ignore[arg-type]
    with _open(tmp_path) as journal:
        journal.append([new, AddRef(queue="q", msg_id=1)], sync=True)
    (segment,) = sorted(tmp_path.glob("journal-*.seg"))
    old_payload = bytes([7]) + codec.encode_generic(old)[1 : -3 * 9]
    with segment.open("ab") as f:
        for type_id, payload, flags in (
            (RecordType.ADD_MESSAGE, old_payload, 0),
            (RecordType.ADD_REF, codec.encode(AddRef(queue="q", msg_id=2)), 0),
            (RecordType.ADD_MESSAGE, codec.encode_generic(odd), 0),
            (RecordType.ADD_REF, codec.encode(AddRef(queue="q", msg_id=3)), 1),
        ):
            f.write(segment_format._frame(type_id, flags, payload))
    assert codec.add_message_layout(codec.encode_generic(odd), 0, 50) is None
    with _open(tmp_path) as journal:
        state = journal.state()
    assert state.messages == {1: new, 2: old, 3: odd}
    assert state.messages[2].header_end == -1  # recovery scans it (as before issue 23)


def test_a_torn_tail_with_a_message_read_by_id_is_cut_and_the_rest_is_read(
    tmp_path: Path,
) -> None:
    """The last append cut short by a crash: its AddMessage (indexed by id only while
    the append was unfinished) is gone with it; the messages before it are whole."""
    with _open(tmp_path) as journal:
        for msg_id in (1, 2, 3):
            journal.append(
                [
                    AddMessage(msg_id=msg_id, address="q", data=bytes([msg_id]) * 100),
                    AddRef(queue="q", msg_id=msg_id),
                ],
                sync=True,
            )
    (segment,) = sorted(tmp_path.glob("journal-*.seg"))
    with segment.open("r+b") as f:
        f.truncate(segment.stat().st_size - 10)  # into the last AddRef
    with _open(tmp_path) as journal:
        state = journal.state()
    assert {k: v.data for k, v in state.messages.items()} == {1: b"\x01" * 100, 2: b"\x02" * 100}
    assert [row[1] for row in state.ref_rows()] == [1, 2]


# --- bulk restore --------------------------------------------------------------------

SETTINGS = {
    "lvq": AddressSettings.of(default_last_value_key="k"),
    "ring": AddressSettings.of(default_ring_size=5),
}


def _broker() -> Harness:
    h = Harness(SETTINGS)
    h.clock.advance(1_000_000)
    for name in ("plain", "other", "lvq", "ring"):
        h.producer(name, "queue")
    return h


def _messages(rng: Random, count: int, now_ms: int) -> list[tuple[str, Message, int, int]]:
    rows = []
    for msg_id in range(1, count + 1):
        props = {"k": f"v{rng.randrange(4)}"}
        sent = ProtonMessage(
            body=f"m{msg_id}", durable=True, priority=rng.randrange(10), properties=props
        )
        message = message_of(sections.scan(bytes(sent.encode())))
        message.msg_id = msg_id
        message.expiration_ms = rng.choice([0, 0, now_ms + rng.randrange(1, 10_000)])
        queue = rng.choice(["plain", "plain", "other", "lvq", "ring"])
        at_ms = rng.choice([0, 0, 0, now_ms - 5, now_ms + rng.randrange(1, 10_000)])
        rows.append((queue, message, rng.randrange(4), at_ms))
    return rows


def _snapshot(h: Harness) -> dict[str, Any]:
    broker = h.broker
    queues = {}
    for name in ("plain", "other", "lvq", "ring"):
        queue = broker.queues[name]
        queues[name] = (
            [
                (r.message.msg_id, r.seq, r.state, r.delivery_count, r.stored_count)
                for r in queue.refs()
            ],
            queue.message_count,
            queue.ready_count,
            queue.scheduled_count,
            queue.size_bytes,
        )
    expiries = sorted((e[0], e[2].name, e[3].message.msg_id) for e in broker._expiries)
    return {
        "queues": queues,
        "memory": broker.memory_bytes,
        "expiries": expiries,
        "deadlines": sorted(broker._deadlines),
        "addresses": {a: broker.post_office.addresses[a].size_bytes for a in queues},
    }


def _drain(h: Harness, name: str) -> list[tuple[int, int]]:
    consumer = h.consumer(name, "queue", credit=1000)
    h.clock.advance(20_000)  # past every schedule; expired ones go
    h.broker.tick()
    return [(d.message.msg_id, d.wire_count) for d in h.take(consumer)]


@pytest.mark.parametrize("seed", range(8))
def test_bulk_restore_equals_one_reference_at_a_time(seed: int) -> None:
    """Random references (priorities, counts, schedules past and future, expiry) into
    plain, last-value and ring queues: `restore_many` per run of one queue leaves the
    same queues, sizes, expiry index and schedule as `restore` per reference, and the
    consumers then get the same messages in the same order with the same counts."""
    one, bulk = _broker(), _broker()
    rows = _messages(Random(seed), 300, one.clock.now_ms())
    for queue, message, count, at_ms in rows:
        assert one.broker.restore(queue, _copy(message), count, at_ms)
    run: list[tuple[Message, int, int]] = []
    for i, (queue, message, count, at_ms) in enumerate(rows):
        run.append((_copy(message), count, at_ms))
        if i + 1 == len(rows) or rows[i + 1][0] != queue:
            assert bulk.broker.restore_many(queue, run)
            run = []
    assert _snapshot(bulk) == _snapshot(one)
    for name in ("plain", "other", "lvq", "ring"):
        assert _drain(bulk, name) == _drain(one, name)
    assert not bulk.broker.restore_many("nowhere", [(_copy(rows[0][1]), 0, 0)])


@pytest.mark.parametrize("seed", range(3))
def test_recovery_in_short_runs_equals_recovery_in_whole_runs(seed: int) -> None:
    """Issue 23 item 4, fifth pass: recovery restores at most `run_max` references per
    call (a bounded list, not one of every reference); runs cut short leave the same
    queues, sizes, expiry index and schedule, and the same deliveries after."""
    rng = Random(seed)
    now_ms = _broker().clock.now_ms()
    appends: list[Record] = []
    for queue, message, count, at_ms in _messages(rng, 200, now_ms):
        appends.append(
            AddMessage(
                msg_id=message.msg_id,
                address=queue,
                data=message.data,
                priority=message.priority,
                expiration_ms=message.expiration_ms,
                header_end=message.header_end,
                head_end=message.head_end,
            )
        )
        appends.append(AddRef(queue=queue, msg_id=message.msg_id, delivery_count=count))
        if at_ms:
            appends.append(ScheduledDelivery(queue=queue, msg_id=message.msg_id, at_ms=at_ms))
    whole, short = _broker(), _broker()
    for h, run_max in ((whole, 1 << 30), (short, 3)):
        persistence = h.broker.persistence
        assert persistence is None or not persistence.suspended
        recovered = recover(h.broker, JournalState.of(appends), message_of, run_max=run_max)
        assert recovered.refs == 200
    assert _snapshot(short) == _snapshot(whole)
    for name in ("plain", "other", "lvq", "ring"):
        assert _drain(short, name) == _drain(whole, name)


def _copy(message: Message) -> Message:
    copy = _message(
        AddMessage(
            msg_id=message.msg_id,
            address="q",
            data=message.data,
            priority=message.priority,
            expiration_ms=message.expiration_ms,
            header_end=-1,
        ),
        message_of,
    )
    copy.priority = message.priority
    return copy


def test_messages_consumed_within_what_the_open_read_are_not_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message added and acknowledged in one segment (the ack in a later append) costs
    the open no index entry (`_short_lived`, as the writer's index); one acked in a later
    segment, or re-added, is indexed; the state is the model's either way."""
    appends: list[list[Record]] = [
        [AddMessage(msg_id=1, address="q", data=b"a"), AddRef(queue="q", msg_id=1)],
        [AddMessage(msg_id=2, address="q", data=b"b"), AddRef(queue="q", msg_id=2)],
        [AckRef(queue="q", msg_id=1)],
        [AddMessage(msg_id=3, address="q", data=b"c"), AddRef(queue="q", msg_id=3)],
    ]
    with _open(tmp_path) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    indexed: list[int] = []
    real = opening.index_plain  # (patched where the open calls it: compiled, `_LiveSet`
    # is a native class, whose methods cannot be patched)

    def counting(seg: Any, batch: list[Any], *rest: Any) -> int:
        indexed.extend(  # the AddMessages (layouts: 11 fields; an AddRef's row has 3)
            record[0] for record, _, _ in batch if isinstance(record, tuple) and len(record) == 11
        )
        return real(seg, batch, *rest)

    monkeypatch.setattr(opening, "index_plain", counting)
    with _open(tmp_path) as journal:
        state = journal.state()
    assert indexed == [2, 3]
    _assert_same_state(state, JournalState.of(r for records in appends for r in records))


def _span(journal: FileJournal, item: Any) -> int | None:
    """An index item's span: a `_Loc`'s, or a packed record's (its handle's slot)."""
    if isinstance(item, int):
        pack = journal._packs[item >> PACK_SHIFT]
        assert pack is not None
        span: int = pack_view(pack)[2][item & _SLOT_MASK]
        return span
    return getattr(item, "span", None)


def _opened_records(journal: FileJournal) -> dict[int, Any]:
    """The open's kept records by span: `_opened_live`'s and the live packed ones' (a
    packed AddRef's count of 0 is no entry in its pack: 0 here)."""
    kept = {item.span: record for item, record in (journal._opened_live or {}).items()}
    for pack in journal._packs:
        if pack is not None and pack.kept is not None:
            spans = pack_view(pack)[2]  # (an unloaded pack's rebuilt: eleventh pass)
            for slot in range(len(spans)):
                record = pack.kept.get(slot, 0 if slot & 1 else None)
                if spans[slot] >= 0 and record is not None:
                    kept[spans[slot]] = record
    return kept


def _index_view(journal: FileJournal) -> tuple[Any, ...]:
    """The index as spans, whichever way each record is held (`_Loc`, packed, or in the
    compact index: issue 23, tenth pass)."""
    live, seg = journal._live, journal._segments[-1]
    packed = [s for pack in seg.packs for s in pack_view(pack)[2] if s >= 0]
    messages = {k: _span(journal, v) for k, v in live.messages.items()}
    refs = {q: {m: _span(journal, r) for m, r in held.items()} for q, held in live.refs.items()}
    assert live.compact is not None
    for pack in live.compact.packs:
        ids, out, spans, _ = pack_view(pack)
        for i, msg_id in enumerate(ids):
            if not out[i]:
                assert msg_id not in messages
                messages[msg_id] = spans[2 * i]
                refs.setdefault(pair_queue(pack, i), {})[msg_id] = spans[2 * i + 1]
    return (
        messages,
        dict(live.ref_counts),
        refs,
        sorted([*seg.items, *packed]),
        seg.live_bytes,
        _opened_records(journal),
        # (live ones: a dead packed record has no span left, a dead `_Loc` keeps its own)
        [
            span
            for item in journal._unread
            if (span := _span(journal, item)) is not None
            and span >= 0
            and (isinstance(item, int) or item.seg.items.get(span) is item)
        ],
    )


def test_the_opens_plain_indexing_equals_the_index_batch_rules(tmp_path: Path) -> None:
    """Issue 23 item 4: `frames.index_plain` (the open's loop for AddMessage layouts and
    AddRefs) leaves the index as `FileJournal._index_batch` does, for the records it
    takes (a message re-added, a reference to a message never added, a second queue), and
    stops at the first record it does not take (an AckRef), which `_index_batch` then
    indexes: the two journals' indexes are the same."""
    message = AddMessage(msg_id=1, address="q", data=b"body")
    payload = codec.encode(message)
    layout = codec.add_message_layout(payload, 0, len(payload))
    assert layout is not None
    two = (2, *layout[1:])
    batch: list[frames.Entry] = [
        (layout, 16, 40),
        (AddRef(queue="q", msg_id=1), 56, 30),
        (AddRef(queue="r", msg_id=1), 86, 30),
        (AddRef(queue="q", msg_id=9), 116, 30),  # no such message: not live
        (two, 146, 40),
        (layout, 186, 40),  # message 1 again: the first add dies
        (AddRef(queue="q", msg_id=2), 226, 30),
        (AckRef(queue="q", msg_id=2), 256, 20),
        (AddRef(queue="q", msg_id=1), 276, 30),
    ]
    with _opening_pair(tmp_path) as (plain, rules, keep, seg):
        done = frames.index_plain(seg, batch, plain._live, keep, plain._unread, seg.packs[-1])
        assert done == 7  # up to the AckRef
        plain._index_batch(seg, batch[done:], keep)
        rules._index_batch(rules._segments[-1], batch, rules._opened_live)
        assert _index_view(plain) == _index_view(rules)
        assert _index_view(plain)[3]  # something is indexed at all
        # A key is its location's own span object (the memory of an index entry: issue 23).
        assert all(span is item.span for span, item in seg.items.items())


def test_a_message_and_its_reference_indexed_as_a_pair_equal_the_two_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 4, fifth and tenth passes: `index_plain` puts an AddMessage and the
    AddRef row after it into the compact index when the id is above every id there; a
    message added again (which moves its pair into the dicts), a row of another id, a
    second queue and a reference of a message never added take the two rules. Either
    way the index is what `_index_batch` makes."""
    message = AddMessage(msg_id=1, address="q", data=b"body")
    payload = codec.encode(message)
    layout = codec.add_message_layout(payload, 0, len(payload))
    assert layout is not None
    two, three = (2, *layout[1:]), (3, *layout[1:])
    batch: list[frames.Entry] = [
        (layout, 16, 40),
        ((1, "q", 0), 56, 30),  # a pair
        (layout, 86, 40),  # message 1 again: the first add dies, and its reference
        ((1, "q", 2), 126, 30),
        ((1, "r", 0), 156, 30),  # a second queue
        (two, 186, 40),
        ((3, "q", 0), 226, 30),  # not its reference: no message 3 (not live)
        (three, 256, 40),
        ((3, "s", 1), 296, 30),  # a pair, in a queue new to the index
        ((9, "q", 0), 326, 30),  # no such message
        (two, 356, 40),  # last: no reference after it
    ]
    with _opening_pair(tmp_path) as (plain, rules, keep, seg):
        assert frames.index_plain(
            seg, batch, plain._live, keep, plain._unread, seg.packs[-1]
        ) == len(batch)
        rules._index_batch(rules._segments[-1], batch, rules._opened_live)

        def records(view: tuple[Any, ...]) -> tuple[Any, ...]:
            # A reference's kept record as its count: a packed one keeps its count alone
            # (its id and queue are its keys in `refs`, compared in view[2]).
            kept = {
                span: r[2]
                if isinstance(r, tuple) and len(r) == 3
                else r.delivery_count
                if isinstance(r, AddRef)
                else r
                for span, r in view[5].items()
            }
            return (*view[:5], kept, view[6])

        assert records(_index_view(plain)) == records(_index_view(rules))
        # 1 went into the dicts when it was added again, 2 is a message with no pair,
        # 3 is only in the compact index
        assert sorted(plain._live.messages) == [1, 2]
        compact = plain._live.compact
        assert compact is not None
        assert list(pack_view(seg.packs[-1])[0]) == [1, 3]
        assert list(pack_view(seg.packs[-1])[1]) == [1, 0]
        assert all(span is item.span for span, item in seg.items.items())


def test_an_add_ref_read_as_a_row_keeps_its_count_on_either_index_path(tmp_path: Path) -> None:
    """Issue 23 item 4: the open reads an AddRef as a row (`codec.RefRow`, no record): on
    the plain path (`frames.index_plain`) and after an AckRef in the same append (the rest
    of it goes through `FileJournal._index_batch`, which makes the row a record again),
    the state keeps each reference's delivery count (B-095) as replaying the files does,
    and keeps no AddRef or AddMessage object for a plain message."""
    appends: list[list[Record]] = [
        [AddQueue(name=q, address=q, routing_type=RoutingType.ANYCAST) for q in QUEUES],
        [
            AddMessage(msg_id=1, address="q", data=b"one", header_end=0, priority=1),
            AddRef(queue="q", msg_id=1, delivery_count=2),
            AddRef(queue="r", msg_id=1),
            AddMessage(msg_id=2, address="q", data=b"two", header_end=0, priority=2),
            AddRef(queue="q", msg_id=2),
        ],
        [
            AckRef(queue="r", msg_id=1),  # (message 1 lives on in q: the ack is indexed)
            AddMessage(msg_id=3, address="q", data=b"three", header_end=0, priority=3),
            AddRef(queue="q", msg_id=3, delivery_count=3),
            AddRef(queue="s", msg_id=1, delivery_count=1),
        ],
    ]
    with _open(tmp_path) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    with _open(tmp_path) as journal:
        kept = list((journal._opened_live or {}).values())
        state = journal.state()
    _assert_same_state(state, JournalState.of(r for records in appends for r in records))
    assert state.ref_rows("q") == [("q", 1, 2, 0), ("q", 2, 0, 0), ("q", 3, 3, 0)]
    assert state.ref_rows("r") == []
    assert state.ref_rows("s") == [("s", 1, 1, 0)]
    plain = [k for k in kept if isinstance(k, (AddRef, AddMessage))]
    assert plain == [
        AddRef(queue="q", msg_id=3, delivery_count=3),
        AddRef(queue="s", msg_id=1, delivery_count=1),
    ]
    stored = state.stored_messages()
    assert all(isinstance(row, tuple) for row in stored.values())
    for msg_id, record in state.messages.items():  # the same Message from a row
        got, want = _message(stored[msg_id], message_of), _message(record, message_of)
        assert (got.data, got.msg_id, got.address, got.priority) == (
            want.data,
            want.msg_id,
            want.address,
            want.priority,
        )
