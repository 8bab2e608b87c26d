"""One local SparkSession for every analytics test (a session takes seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from support.jvm import QUICK_JIT

from amqpbroker.analytics.job import build_session, configure


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Two shuffle partitions, not the job's 8 (configure: at least 8): a task each on
    # tables of a few rows, ~0.05 CPU-s apiece; two still put rows of one table in
    # different partitions (docs/decisions.md, "The long tier").
    # The code generator's cache of compiled classes at 5,000, not Spark's 100: one run's
    # ~122 queries overflow 100, so every run of the unit compiled them all again with
    # Janino; the plans and the generated code are the same (a warm run 40.6 -> 31.8 JVM
    # CPU-s: docs/decisions.md, "Suite time, fourth pass").
    session = build_session(
        "local[1]",
        driver_memory="1g",
        java_options=QUICK_JIT,
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.codegen.cache.maxEntries": "5000",
        },
    )
    configure(session)
    yield session
    session.stop()
