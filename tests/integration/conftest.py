"""Shared integration fixtures: each module defines its own `broker` (its config)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton.utils import BlockingConnection
from support.client import connect
from support.process import BrokerProcess, start_broker


@pytest.fixture
def conn(broker: BrokerProcess) -> Iterator[BlockingConnection]:
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
