"""A filtered move of a large durable paged queue over the HTTP API, SIGKILLed in the
middle (issue 23, B-151 with B-161 and B-095): the real broker process, a real AMQP
client, the real HTTP API. The walk removes the paged messages it took a slice at a time
(`PageSkip`, journaled with the slice's moved copies), so that after a restart every
message is in exactly one of the two queues: none moved and still paged (a duplicate,
as when the page files were rewritten once at the walk's end), none lost.

The broker's slices are made small and slow (`SLOW_SLICES`) so that the kill lands in
the middle of the walk whatever the machine's load. When the target queue pages too, the
moved copies are synced to its page files before the step's journal append: the second
test kills the broker right between the two (`KILL_BEFORE_APPEND`), the one window where
a copy was on disk and its original's removal was not."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import bulk
from support.process import BrokerProcess, start_broker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
N = 12_000  # 1 KiB durable messages; the address pages past 1 MiB
CONFIG = """
    global-max-size: 268435456
    persistence:
      enabled: true
    address-settings:
      "#": {page-size-bytes: 262144, max-read-page-bytes: 1048576}
      "q": {max-size-bytes: 1048576}
    addresses:
      - name: q
        anycast: [{name: q}]
      - name: moved
        anycast: [{name: moved}]
    """
# `amqpbroker run` with slices of 50 messages that each take 5 ms more: a walk of N
# messages lasts more than a second, so the kill below lands inside it.
SLOW_SLICES = """
import runpy, sys, time
import amqpbroker.core.operations as ops
ops.SLICE_MESSAGES = 50
real = ops._slice
def slow(broker, walk):
    time.sleep(0.005)
    return real(broker, walk)
ops._slice = slow
sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


# `SLOW_SLICES`, and SIGKILL in the 40th slice's step once its page files are synced and
# before its journal append (a step in which the walk paged copies).
KILL_BEFORE_APPEND = SLOW_SLICES.replace(
    "ops._slice = slow",
    """slices = [0]
def counting(broker, walk):
    slices[0] += 1
    return slow(broker, walk)
ops._slice = counting
import os, signal
from amqpbroker.core import persistence
real_flush = persistence.Persistence.flush
def flush(self):
    if slices[0] >= 40 and self._moved_in and self.before_flush is not None:
        self.before_flush()  # the copies are on disk...
        os.kill(os.getpid(), signal.SIGKILL)  # ...their originals' removal is not
    return real_flush(self)
persistence.Persistence.flush = flush""",
)


def _api(broker: BrokerProcess, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Requested-By": "test"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_sigkill_in_the_middle_of_a_filtered_move_of_a_paged_queue_repeats_and_loses_none(
    tmp_path: Path,
) -> None:
    broker = start_broker(tmp_path, CONFIG, log_level="info", python=("-c", SLOW_SLICES))
    sent = bulk.send(broker.url, "q", range(N), properties=lambda i: {"k": i % 2})
    assert sent == N
    assert _api(broker, "/api/v1/queues/q")["paged_messages"] > N * 8 // 10
    failed: list[BaseException] = []

    def move() -> None:
        try:
            _api(broker, "/api/v1/queues/q/move", {"to-queue": "moved", "filter": "k = 0"})
        except (urllib.error.URLError, ConnectionError, OSError) as e:  # killed: expected
            failed.append(e)

    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    # past the in-memory part (~1,000 messages), into the paged one
    wait_until(lambda: _api(broker, "/api/v1/queues/moved")["messages"] >= N // 8, timeout=120)
    broker.kill()
    mover.join(timeout=60)
    assert failed, "the move ended before the kill: the test did not cut it in the middle"

    broker = start_broker(tmp_path, CONFIG, log_level="info")
    try:
        in_q = _api(broker, "/api/v1/queues/q")["messages"]
        in_moved = _api(broker, "/api/v1/queues/moved")["messages"]
        assert N // 8 <= in_moved < N // 2  # cut in the middle of the walk
        assert in_q + in_moved == N  # none both moved and still paged, none lost
        left = bulk.receive(broker.url, "q", in_q)
        moved = bulk.receive(broker.url, "moved", in_moved)
        assert sorted(left + moved) == list(range(N))
        assert all(i % 2 == 0 for i in moved)
        assert left == sorted(left)  # what stayed is in its order (B-014)
        assert moved == sorted(moved)
    finally:
        broker.stop()


def test_sigkill_between_the_copies_sync_and_the_append_of_a_move_into_a_paging_queue(
    tmp_path: Path,
) -> None:
    config = CONFIG.replace("global-max-size: 268435456", "global-max-size: 1048576")
    broker = start_broker(tmp_path, config, log_level="info", python=("-c", KILL_BEFORE_APPEND))
    assert bulk.send(broker.url, "q", range(N), properties=lambda i: {"k": i % 2}) == N
    try:
        _api(broker, "/api/v1/queues/q/move", {"to-queue": "moved", "filter": "k = 0"})
    except (urllib.error.URLError, ConnectionError, OSError):
        pass  # killed in the middle, as injected
    else:
        raise AssertionError("the move ended: the injected kill did not happen")
    broker.proc.wait(timeout=60)

    broker = start_broker(tmp_path, config, log_level="info")
    try:
        in_q = _api(broker, "/api/v1/queues/q")["messages"]
        moved_row = _api(broker, "/api/v1/queues/moved")
        assert moved_row["paged_messages"] > 0  # the copies went to its page files
        assert 0 < moved_row["messages"] < N // 2
        assert in_q + moved_row["messages"] == N  # no copy whose original stayed
        left = bulk.receive(broker.url, "q", in_q)
        moved = bulk.receive(broker.url, "moved", moved_row["messages"])
        assert sorted(left + moved) == list(range(N))
        assert "whose journal append was lost are passed" in broker.log()
    finally:
        broker.stop()
