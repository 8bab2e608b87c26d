"""Shared integration fixtures, and the one module broker (issue 18).

`broker` is the module's broker, started once per module: the module says how with
module-level names, all optional:

* `BROKER_CONFIG`: config text added to the test base config (`support.process`);
* `BROKER_IN_THREAD = True`: the asyncio server in a thread on a manual clock
  (`support.inproc`: `broker.advance_clock(ms)`), else `amqpbroker run` in a process;
* `BROKER_LOG_LEVEL`: the process's `--log-level` (default debug).

A module that needs more (certificates, traffic before the tests) defines its own
`broker` fixture, which overrides this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton.utils import BlockingConnection
from support.client import connect
from support.inproc import ThreadBroker, start_in_thread
from support.process import BrokerProcess, start_broker


@pytest.fixture(scope="module")
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess | ThreadBroker]:
    """The module's broker (see the module docstring); must stop cleanly, its log
    without a traceback."""
    module = request.module
    config: str = getattr(module, "BROKER_CONFIG", "")
    directory = tmp_path_factory.mktemp(module.__name__.rsplit(".", 1)[-1])
    running: BrokerProcess | ThreadBroker
    if getattr(module, "BROKER_IN_THREAD", False):
        running = start_in_thread(directory, config)
    else:
        running = start_broker(
            directory, config, log_level=getattr(module, "BROKER_LOG_LEVEL", "debug")
        )
    yield running
    assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()  # nothing a test did escaped a handler


@pytest.fixture
def conn(broker: BrokerProcess | ThreadBroker) -> Iterator[BlockingConnection]:
    """A connection to the module's broker, closed after the test."""
    connection = connect(broker.url)
    yield connection
    connection.close()


@pytest.fixture
def spawn() -> Iterator[Callable[..., BrokerProcess]]:
    """`start_broker` for tests that start (and kill) brokers themselves: whatever is
    still running when the test ends, even by a failed assertion, is killed."""
    started: list[BrokerProcess] = []

    def start(directory: Path, extra_config: str = "", **kwargs: Any) -> BrokerProcess:
        broker = start_broker(directory, extra_config, **kwargs)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.kill()


@pytest.fixture
def broker_in_thread(tmp_path: Path) -> Iterator[Callable[[str], ThreadBroker]]:
    """`start_in_thread` for a test that wants a broker of its own on a manual clock;
    stopped when the test ends."""
    started: list[ThreadBroker] = []

    def start(extra_config: str = "") -> ThreadBroker:
        directory = tmp_path / f"broker-{len(started)}"
        directory.mkdir()
        started.append(start_in_thread(directory, extra_config))
        return started[-1]

    yield start
    for running in started:
        running.stop()
