"""One local SparkSession for every analytics test (a session takes seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from support.jvm import QUICK_JIT

from amqpbroker.analytics.job import build_session, configure


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("local[1]", driver_memory="1g", java_options=QUICK_JIT)
    configure(session)
    yield session
    session.stop()
