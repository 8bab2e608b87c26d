"""Shared integration fixtures: each module defines its own `broker` (its config)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proton.utils import BlockingConnection
from support.client import connect
from support.process import BrokerProcess


@pytest.fixture
def conn(broker: BrokerProcess) -> Iterator[BlockingConnection]:
    """A connection to the module's broker, closed after the test."""
    connection = connect(broker.url)
    yield connection
    connection.close()
