"""The throttled retry's pacing (B-161 `rate`): one procedure for the API and the CLI
(issue 18 item 4)."""

from __future__ import annotations

from amqpbroker.management.pacing import paced


class FakeTime:
    """A clock that moves only when slept on, or when a step 'takes' time."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_chunks_are_at_most_the_rate_and_the_cap() -> None:
    t = FakeTime()
    ids = list(range(250))
    chunks = list(paced(ids, 1000, clock=t.clock, sleep=t.sleep))
    assert [len(c) for c in chunks] == [100, 100, 50]
    assert [i for c in chunks for i in c] == ids
    t = FakeTime()
    assert [len(c) for c in paced(ids[:7], 3, clock=t.clock, sleep=t.sleep)] == [3, 3, 1]
    t = FakeTime()
    assert [len(c) for c in paced(ids[:2], 0.5, clock=t.clock, sleep=t.sleep)] == [1, 1]


def test_the_pace_keeps_the_rate_since_the_start() -> None:
    """10 ids at 5/s in chunks of 5: 1 s after each chunk, less the time its step took."""
    t = FakeTime()
    for _ in paced(list(range(10)), 5, clock=t.clock, sleep=t.sleep):
        t.now += 0.25  # the step itself
    assert t.slept == [0.75, 0.75]
    assert t.now == 102.0


def test_a_slow_step_is_not_followed_by_a_pause() -> None:
    t = FakeTime()
    for _ in paced(list(range(4)), 2, clock=t.clock, sleep=t.sleep):
        t.now += 5.0
    assert t.slept == []


def test_nothing_to_pace() -> None:
    t = FakeTime()
    assert list(paced([], 10, clock=t.clock, sleep=t.sleep)) == []
    assert t.slept == []
