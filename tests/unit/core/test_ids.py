"""Message ids from durably reserved blocks (issue 16 item 2, Artemis BatchingIDGenerator)."""

from __future__ import annotations

import pytest

from amqpbroker.core import ResourceLimitExceeded
from amqpbroker.core.ids import MessageIds


def test_each_block_is_reserved_before_its_first_id() -> None:
    """reserve(end) runs before any id of the block; none at or above `end` is used."""
    reserved: list[int] = []
    used: list[int] = []
    ids = MessageIds(block=4)

    def reserve(end: int) -> None:
        assert not used or used[-1] < end - 4  # the previous block is used up first
        reserved.append(end)

    ids.reserve_with(reserve, 0)
    assert reserved == [5]  # at start-up, before any message
    used.extend(next(ids) for _ in range(9))
    assert used == list(range(1, 10))
    assert reserved == [5, 9, 13]
    assert max(used) < reserved[-1]


def test_a_restart_starts_at_the_last_reserved_end() -> None:
    """A previous run may have used every id below its reserved end, none above."""
    ids = MessageIds(block=100)
    ids.start_above(7)  # the journal's largest id
    ids.reserve_with(lambda end: None, 250)
    assert next(ids) == 250
    assert ids.reserved_end == 350


def test_the_journal_floor_wins_over_an_older_reservation() -> None:
    ids = MessageIds(block=100)
    ids.start_above(999)
    ids.reserve_with(lambda end: None, 250)
    assert next(ids) == 1000


def test_an_unwritable_reservation_refuses_the_message_and_tries_again() -> None:
    """No id is handed out unreserved; the next message retries the reservation."""
    failing = [False]

    def reserve(end: int) -> None:
        if failing[0]:
            raise OSError(28, "No space left on device")

    ids = MessageIds(block=2)
    ids.reserve_with(reserve, 0)
    assert [next(ids), next(ids)] == [1, 2]
    failing[0] = True
    with pytest.raises(ResourceLimitExceeded, match="cannot reserve message ids"):
        next(ids)
    failing[0] = False
    assert next(ids) == 3


def test_a_start_up_reservation_failure_is_an_os_error() -> None:
    def reserve(end: int) -> None:
        raise OSError(13, "Permission denied")

    with pytest.raises(OSError, match="Permission denied"):
        MessageIds().reserve_with(reserve, 0)


def test_a_full_disk_at_start_up_hands_out_nothing_until_a_block_is_reserved() -> None:
    """Crash pass: the server starts on a full disk (ENOSPC) with `wait_for_room`; no id
    is handed out unreserved, each message is refused, and the first reservation that
    works starts at the previous run's end, as a start-up reservation would have."""
    full = [True]
    reserved: list[int] = []

    def reserve(end: int) -> None:
        if full[0]:
            raise OSError(28, "No space left on device")
        reserved.append(end)

    ids = MessageIds(block=10)
    ids.start_above(3)  # the journal's largest id
    with pytest.raises(OSError, match="No space"):
        ids.reserve_with(reserve, 50)
    ids.wait_for_room()
    assert next(ids.ready, 0) == 0  # the hot path's step finds nothing ready
    for _ in range(2):
        with pytest.raises(ResourceLimitExceeded, match="cannot reserve message ids"):
            next(ids)
    full[0] = False
    assert next(ids) == 50
    assert reserved == [60]


def test_without_a_reservation_ids_count_up() -> None:
    ids = MessageIds(block=2)
    assert [next(ids) for _ in range(5)] == [1, 2, 3, 4, 5]


def test_the_hot_path_reserves_each_block_as_next_does() -> None:
    """Issue 20: the broker takes `next(ids.ready, 0) or next(ids)` per message; a block's
    ids come from `ready` and its end still reserves the next block before any id of it,
    also after `start_above` moved past the reserved end."""
    reserved: list[int] = []
    ids = MessageIds(block=4)
    ids.reserve_with(reserved.append, 0)
    taken = [next(ids.ready, 0) or next(ids) for _ in range(9)]
    assert taken == list(range(1, 10))
    assert reserved == [5, 9, 13]
    ids.start_above(20)  # beyond the reserved end (13)
    assert (next(ids.ready, 0) or next(ids)) == 21
    assert reserved == [5, 9, 13, 25]
