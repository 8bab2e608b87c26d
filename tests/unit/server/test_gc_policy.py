"""Issue 20 (latency, a periodic stall): how often the broker's collector looks at the
objects that stay alive, such as the messages of a queue that builds up.

A middle-generation collection walks every object that survived the young collections
since the last one. With CPython's threshold (a middle collection every 12th young
trigger) and the broker's 10,000 allocations a young collection, a queue filling at full
speed stalled the loop ~37 ms about once a second; at every 2nd trigger it walks a sixth
as many. Counted, not timed: the objects made between two middle (or full) collections.
"""

from __future__ import annotations

import gc
from typing import Any

from amqpbroker.server import GC_YOUNG_THRESHOLD, tune_gc

KEPT = 100_000  # objects that stay alive: 10 young collections' worth


def test_objects_that_stay_alive_are_walked_in_small_batches() -> None:
    saved = gc.get_threshold()
    made = 0
    between: list[int] = []  # objects made between two middle (or full) collections
    last = 0

    def counted(phase: str, info: dict[str, Any]) -> None:
        nonlocal last
        if phase == "start" and info["generation"] >= 1:
            between.append(made - last)
            last = made

    kept: list[list[int]] = []
    try:
        tune_gc()
        gc.callbacks.append(counted)
        try:
            for i in range(KEPT):
                kept.append([i])  # one tracked object each, like a queued message's parts
                made += 1
        finally:
            gc.callbacks.remove(counted)
        young, middle, old = gc.get_threshold()
    finally:
        gc.unfreeze()  # tune_gc froze the test process's heap
        gc.set_threshold(*saved)
    assert len(kept) == KEPT
    # Before: no middle collection at all in 10 young triggers' worth (every 12th).
    assert len(between) >= 4
    assert max(between[1:]) <= 2 * GC_YOUNG_THRESHOLD + 100  # + what pytest allocates
    # Full collections keep CPython's pace: (10 + 2) x (10 + 1) young triggers.
    assert (middle + 2) * (old + 1) >= 12 * 11
    assert young == GC_YOUNG_THRESHOLD
