"""Shared fixtures for the client-stack interop tests (issue 21).

One broker per module (PLAIN over amqp and amqps, dead-lettering on), each stack's cases
run by one driver process, the cross matrix driven by one send and one receive per stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.interop import broker_config
from support.process import BrokerProcess, create_certs, start_broker


@pytest.fixture(scope="session")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a server certificate for `localhost` (`amqpbroker certs create`)."""
    return create_certs(tmp_path_factory.mktemp("interop-certs"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, cert_dir: Path) -> Iterator[BrokerProcess]:
    running = start_broker(tmp_path_factory.mktemp("interop"), broker_config(cert_dir))
    yield running
    assert running.stop() == 0, running.log()
