"""One local SparkSession for every analytics test (a session takes seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from amqpbroker.analytics.job import build_session, configure


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # C1 only: tiny data in a short-lived JVM, where full JIT compilation never pays off.
    session = build_session("local[1]", driver_memory="1g", java_options="-XX:TieredStopAtLevel=1")
    configure(session)
    yield session
    session.stop()
