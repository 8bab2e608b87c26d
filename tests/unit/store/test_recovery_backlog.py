"""Issue 23 ("memory bounded during recovery", B-151 PAGE): a journal holding more than
`global-max-size` is recovered with only that much in memory; the rest of the queue stays
in the journal (`store/backlog.py`) and comes back, in order, with its delivery counts
(B-095) and schedule (B-065), as the queue drains. Purges, removals and expiry of those
messages are journaled (a restart does not bring them back); nothing is duplicated."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Message as ProtonMessage
from support.core_harness import Harness
from support.journal_backlog import (
    BUDGET,
    N,
    Restarted,
    amqp,
    append_messages,
    expected,
    open_journal,
    write,
)

from amqpbroker.core import AddressSettings
from amqpbroker.core import operations as ops
from amqpbroker.core import queue as queue_module
from amqpbroker.core.model import RoutingType
from amqpbroker.core.outcomes import Modified
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.records import AddQueue
from amqpbroker.protocol import message_of
from amqpbroker.store.backlog import JournalBacklog
from amqpbroker.store.locs import Run
from amqpbroker.store.recovery import recover


def test_only_the_budget_is_in_memory_and_the_rest_drains_in_order(tmp_path: Path) -> None:
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    queue = r.h.queue("q")
    assert isinstance(queue.pages, JournalBacklog)
    assert queue.size_bytes <= BUDGET + 2 * 1024  # the budget, and the message past it
    assert queue.message_count == N  # the journal's part counts (Artemis messageCount)
    assert r.recovered.refs == N
    got = r.drain()
    # in order, each once, with its persisted count (B-095); 9 still waits (B-065)
    assert got == expected(range(1, N + 1))
    assert queue.message_count == 1
    r.close()
    again = Restarted(tmp_path)
    assert again.h.queue("q").message_count == 1  # the acks are in the journal
    again.close()


def test_a_restart_halfway_through_draining_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    first = r.drain(limit=150)  # past the in-memory part, into the journal's
    r.close()
    again = Restarted(tmp_path)
    rest = again.drain()
    again.close()
    assert first + rest == expected(range(1, N + 1))


def test_a_purge_and_a_removal_by_id_are_journaled(tmp_path: Path) -> None:
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    assert ops.purge(r.h.broker, "q", ids=[200, 3]) == 2  # one in the journal's part
    assert r.h.queue("q").message_count == N - 2
    r.close()
    again = Restarted(tmp_path)
    assert again.drain() == [
        e for e in expected(range(1, N + 1)) if e[0] not in ("message-00200", "message-00003")
    ]
    again.close()
    third = Restarted(tmp_path)
    assert third.h.queue("q").message_count == 1
    ops.purge(third.h.broker, "q")
    assert third.h.queue("q").message_count == 0
    third.close()
    fourth = Restarted(tmp_path)
    assert fourth.h.queue("q").message_count == 0
    fourth.close()


def test_a_purge_before_any_read_back_is_journaled(tmp_path: Path) -> None:
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    assert ops.purge(r.h.broker, "q") == N
    r.close()
    again = Restarted(tmp_path)
    assert again.h.queue("q").message_count == 0
    again.close()


def test_without_a_budget_everything_is_in_memory_as_before(tmp_path: Path) -> None:
    write(tmp_path / "journal")
    r = Restarted(tmp_path, budget=-1)
    assert r.h.queue("q").pages is None
    assert r.h.queue("q").message_count == N
    assert r.drain() == expected(range(1, N + 1))
    r.close()


def test_a_returned_message_read_back_from_the_journal_keeps_counting(tmp_path: Path) -> None:
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    r.drain(limit=100)
    h = r.h
    consumer = h.consumer("q", "queue", credit=1)
    [d] = h.take(consumer)
    h.settle(consumer, d, Modified(delivery_failed=True))
    r.close()
    again = Restarted(tmp_path)
    got = again.drain()
    again.close()
    assert got[0] == ("message-00101", 1)  # B-095: the count of the return is kept
    assert len(got) == N - 100 - 1


def test_a_queue_of_another_kind_comes_back_whole_with_the_bodies_the_open_left(
    tmp_path: Path,
) -> None:
    """A ring queue (B-121; last-value and non-destructive alike) is not read back in
    steps: past the budget its messages' bodies, which the open left in the journal,
    are read from it at recovery and the queue is whole in memory, as before."""
    ring = AddQueue(
        name="r", address="r", routing_type=RoutingType.ANYCAST, extra={"ring_size": 1000}
    )
    journal = open_journal(tmp_path / "journal")
    journal.append([ring], sync=True)
    append_messages(journal, "r", 100)
    journal.close()
    r = Restarted(tmp_path)
    queue = r.h.queue("r")
    assert queue.kind is not None
    assert queue.pages is None
    assert queue.message_count == 100
    bodies = []
    for ref in queue.refs():
        decoded = ProtonMessage()
        decoded.decode(ref.message.data)
        bodies.append(str(decoded.body)[:13])
    assert bodies == [f"message-{i:05d}" for i in range(1, 101)]
    r.close()


@pytest.mark.parametrize("operation", ["purge", "move"])
def test_a_sliced_walk_over_the_journal_part_is_journaled_and_keeps_arrivals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """A management purge or move of all, a slice at a time (issue 23, B-161), over a
    queue whose part past the budget is in the journal: what it took is acknowledged
    there as it goes (`drop_prefix`, `purge_paged_step`), messages sent meanwhile (paged
    behind that part) stay, and a restart brings back neither the taken ones nor
    duplicates."""
    monkeypatch.setattr(ops, "SLICE_MESSAGES", 25)
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    h = r.h
    late = h.producer("q", "queue")
    if operation == "move":
        h.producer("dest", "queue")
        walk = ops.move_walk(h.broker, "q", to_queue="dest")
    else:
        walk = ops.purge_walk(h.broker, "q")
    arrivals = iter(range(N + 1, 2 * N))
    sent: list[int] = []
    while not walk.step():
        i = next(arrivals)
        h.send(late, amqp(i), durable=True)
        sent.append(i)
        r.persistence.flush()
    assert walk.result == N
    assert len(sent) >= N // 25 - 1
    assert h.queue("q").message_count == len(sent)
    r.close()
    again = Restarted(tmp_path)
    assert again.h.queue("q").message_count == len(sent)
    assert [body for body, _ in again.drain()] == [f"message-{i:05d}" for i in sent]
    if operation == "move":
        assert again.h.queue("dest").message_count == N
    again.close()


def test_a_move_cut_between_its_copies_sync_and_its_append_leaves_no_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 (B-151 with B-161): the copies a walk pages to a durable queue are synced
    before the append that removes their originals; a crash between the two left both
    (each copy paged, its original still in `q`). Now the append carries the target's
    `committed` end, and a restart passes the copies after it: every message once."""
    monkeypatch.setattr(ops, "SLICE_MESSAGES", 25)
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    r.h.producer("dest", "queue")
    walk = ops.move_walk(r.h.broker, "q", to_queue="dest")
    for _ in range(4):  # journaled slices
        walk.step()
        r.persistence.flush()
    dest = r.h.queue("dest")
    assert dest.pages is not None
    assert dest.pages.messages > 0  # its copies are paged
    walk.step()
    r.files.flush()  # the slice's copies are on disk (`before_flush`) ...
    r.persistence._records.clear()  # ... and its append is lost: SIGKILL
    r.persistence._moved_in.clear()
    r.journal.flush()
    r.files.close()
    r.journal.close()
    again = Restarted(tmp_path)
    in_q = again.h.queue("q").message_count
    in_dest = again.h.queue("dest").message_count
    assert in_dest == 4 * 25
    assert in_q + in_dest == N
    again.close()


def test_a_purge_on_no_consumers_cut_by_a_crash_leaves_each_message_purged_or_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B-126 over B-151 (issue 23): the last consumer leaving a recovered queue whose
    part past the budget is in the journal kills it a read step a loop turn, each step
    acknowledged in the journal with the step's append. A crash in the middle: the
    killed ones never come back, the rest are all there, in order, none twice (as
    Artemis, whose purge commits batch by batch; the rest is purged when the next
    consumer leaves)."""
    purging = AddQueue(
        name="q",
        address="q",
        routing_type=RoutingType.ANYCAST,
        extra={"purge_on_no_consumers": True},
    )
    monkeypatch.setattr(queue_module, "READ_STEP_MESSAGES", 50)  # steps of 50, not 256
    write(tmp_path / "journal", [purging])
    r = Restarted(tmp_path)
    queue = r.h.queue("q")
    assert queue.config.purge_on_no_consumers
    assert isinstance(queue.pages, JournalBacklog)
    consumer = r.h.consumer("q", "queue", credit=0)
    r.h.broker.detach_consumer(consumer, closed=True)
    r.persistence.flush()
    in_memory = queue.counters.killed
    for _ in range(2):
        r.h.advance(0)  # a loop turn: a read step of the journal's part
        r.persistence.flush()
    killed = queue.counters.killed
    assert in_memory < killed < N - 10  # cut in the middle of the paged part
    assert queue.message_count == N - killed
    r.close()  # the crash: the steps' appends are in the journal, nothing more
    again = Restarted(tmp_path)
    assert again.h.queue("q").message_count == N - killed
    assert again.drain() == expected(range(killed + 1, N + 1))
    again.close()


def test_the_backlog_takes_the_runs_of_recovery_without_a_row(tmp_path: Path) -> None:
    """Issue 23, ninth and tenth passes: the references past the budget, all left in the
    journal by the open, become the backlog's as the runs of the compact index recovery
    read them in (`ref_parts`, `JournalBacklog.adopt_run`): no row a reference at the
    peak, their ids and sizes the packs'; they drain the same."""
    write(tmp_path / "journal")
    journal = open_journal(tmp_path / "journal", body_budget=BUDGET)
    h = Harness({"#": AddressSettings.of()}, global_max_size=BUDGET)
    h.broker.enable_persistence(Persistence(journal))
    state = journal.state()
    parts = dict(state.ref_parts())["q"]
    runs = [part for part in parts if isinstance(part, Run)]
    assert runs
    assert sum(len(run) for run in runs) > N // 2
    recovered = recover(h.broker, state, message_of, read=journal.read_message, budget=BUDGET)
    backlog = h.queue("q").pages
    assert isinstance(backlog, JournalBacklog)
    assert all(any(part is run for part in backlog._parts) for run in runs)
    assert recovered.refs == N
    assert h.queue("q").message_count == N
    journal.close()


def test_a_backlog_of_runs_and_rows_reads_back_in_order_with_its_oldest_ts(
    tmp_path: Path,
) -> None:
    """Issue 23, tenth pass: the messages counted and scheduled after their pairs (N-7,
    N-9) leave the compact index, so the backlog is runs with rows between them; the
    oldest timestamp of a run's head is read from its file (first_ts = id here), and
    the whole drains in order with the counts (B-095) and without the scheduled one."""
    write(tmp_path / "journal")
    r = Restarted(tmp_path)
    backlog = r.h.queue("q").pages
    assert isinstance(backlog, JournalBacklog)
    kinds = ["run" if isinstance(part, Run) else "rows" for part in backlog._parts]
    assert kinds[-3:] == ["run", "rows", "run"]  # ..., N-9 (rows), N-8, N-7 (rows), ...
    assert "run" in kinds
    assert backlog.oldest_ts() == backlog._id(backlog._next)  # (first_ts = id)
    got = r.drain()
    assert got == expected(range(1, N + 1))
    assert backlog.oldest_ts() is None
    r.close()
