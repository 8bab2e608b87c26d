"""`broker_in_thread`: the real asyncio server (`amqpbroker/server.py`) on port 0 in a
thread of the test process, on a `ManualClock` the test advances (issue 18).

Redelivery delays, expiry and scheduled deliveries then happen when the test says so,
not when the wall clock gets there: `advance_clock(ms)` moves the clock on the broker's
loop and runs the broker's timer work (`BrokerServer.run_tick`) there, so what falls due
is dispatched before it returns. Clients still talk AMQP over loopback to real sockets.
The clock starts at the wall-clock time, so a client's absolute expiry times mean what
they say. Use `support.process.start_broker` instead for the CLI, crashes and restarts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from amqpbroker.config import load_config
from amqpbroker.core import ManualClock
from amqpbroker.server import BrokerServer
from support.process import write_config

T = TypeVar("T")

START_TIMEOUT_S = 20
CALL_TIMEOUT_S = 10


class _Log(logging.Handler):
    """Keeps the broker's log lines (with tracebacks) for `ThreadBroker.log()`."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class ThreadBroker:
    """A running in-process broker. Its loop runs in its own thread; every method here
    is safe to call from the test's thread."""

    def __init__(self, directory: Path, extra_config: str = "") -> None:
        self.config = load_config(write_config(directory, extra_config))
        self._log = _Log()
        self._logger = logging.getLogger("amqpbroker")
        self._level = self._logger.level
        self._logger.addHandler(self._log)
        self._logger.setLevel(logging.DEBUG)
        self.data_dir = directory / "data"
        self.clock = ManualClock(start_ms=time.time_ns() // 1_000_000)
        self.loop = asyncio.new_event_loop()
        self._started: concurrent.futures.Future[BrokerServer] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="broker-in-thread", daemon=True)
        self._thread.start()
        try:
            self.server = self._started.result(timeout=START_TIMEOUT_S)
        except BaseException:
            self._detach_log()
            raise
        self.ports = dict(self.server.ports)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            server = BrokerServer(self.config, data_dir=self.data_dir, clock=self.clock)
            self.loop.run_until_complete(server.start())
        except BaseException as e:
            self._started.set_exception(e)
            self.loop.close()
            return
        self._started.set_result(server)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.ports['amqp']}"

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the broker's loop and return what it returns."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:
                done.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout=CALL_TIMEOUT_S)

    def advance_clock(self, ms: int) -> None:
        """Move the broker's clock `ms` on and run what falls due (redeliveries, the
        expiry scan, the reaper); what that dispatches is written before this returns.

        The broker acts on what a client sent once it has read it: after sending an
        outcome or a message, make a round trip (`support.client.is_empty`) first."""

        def advance() -> None:
            self.clock.advance(ms)
            self.server.run_tick()

        self.call(advance)

    def stop(self) -> int:
        """Stop the server (an orderly AMQP close of every connection) and its thread;
        0 as a broker process's exit status would be."""
        if not self._thread.is_alive():
            return 0
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(
                timeout=CALL_TIMEOUT_S
            )
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=CALL_TIMEOUT_S)
        finally:
            self._detach_log()
        return 1 if self._thread.is_alive() else 0

    def _detach_log(self) -> None:
        self._logger.removeHandler(self._log)
        self._logger.setLevel(self._level)

    def log(self) -> str:
        """What the broker logged (the `amqpbroker` loggers, debug and up)."""
        return "\n".join(self._log.lines)


def start_in_thread(directory: Path, extra_config: str = "") -> ThreadBroker:
    """Start the in-process broker with the test base config + `extra_config` (the same
    sections as `support.process.start_broker`)."""
    return ThreadBroker(directory, extra_config)
