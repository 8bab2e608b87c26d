"""Spark jobs, tasks and CPU seconds of whole `analyze` runs as the tests run them.

What a test's whole-job run costs is Spark's overhead per job and task (planning, code
generation, scheduling), not data: the tests' logs are a few thousand events. This runs
the job ROUNDS times (fresh `--out` each) over the synthetic log of
tests/analytics/test_incremental.py (EVENTS, 6,000) on the tests' session (`local[1]`,
tests/support/jvm.py's JIT options) and prints, per run, the Spark jobs and tasks (the
status store) and the CPU seconds of the driver JVM (/proc) and of this process. Run 0
pays the JVM's warm-up; later runs are what each further run in a test worker costs.

    .venv/bin/python bench/analytics_jobs.py
    ROUNDS=3 PARTITIONS=8 CONF=spark.sql.adaptive.enabled=false .venv/bin/python \\
        bench/analytics_jobs.py

PARTITIONS: spark.sql.shuffle.partitions in the SparkConf (default 2, as
tests/analytics/conftest.py; unset: the job's own choice); CONF: comma-separated runtime
settings; SESSION_CONF: comma-separated settings for the SparkConf (static ones, such as
spark.sql.codegen.cache.maxEntries); JAVA_OPTIONS: the driver JVM's options instead of
tests/support/jvm.py's. Wall times mean little on a shared machine; the CPU seconds and
counts do.
"""

from __future__ import annotations

import io
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.jvm import QUICK_JIT
from support.synth_events import generate

from amqpbroker.analytics.job import JobOptions, build_session, configure, run
from amqpbroker.analytics.tables import TriageSettings


def jvm_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    partitions = os.environ.get("PARTITIONS", "2")
    conf = {"spark.sql.shuffle.partitions": partitions} if partitions else {}
    for setting in filter(None, os.environ.get("SESSION_CONF", "").split(",")):
        key, value = setting.split("=", 1)
        conf[key] = value
    java_options = os.environ.get("JAVA_OPTIONS", QUICK_JIT)
    spark = build_session("local[1]", driver_memory="1g", java_options=java_options, conf=conf)
    configure(spark)
    for setting in filter(None, os.environ.get("CONF", "").split(",")):
        key, value = setting.split("=", 1)
        spark.conf.set(key, value)
    pid = spark.sparkContext._gateway.proc.pid  # type: ignore[attr-defined]
    store = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]

    def counts() -> tuple[int, int]:
        jobs = store.jobsList(None)
        tasks = sum(
            jobs.apply(k).numTasks() - jobs.apply(k).numSkippedTasks() for k in range(jobs.size())
        )
        return jobs.size(), tasks

    tmp = Path(tempfile.mkdtemp(prefix="analytics-jobs-"))
    planted = generate(
        tmp / "events", events=int(os.environ.get("EVENTS", "6000")), file_events=1_000_000
    )
    settings = TriageSettings(window_ms=planted.window_ms)
    for n in range(int(os.environ.get("ROUNDS", "2"))):
        (jobs0, tasks0), jvm0, own0 = counts(), jvm_cpu_s(pid), own_cpu_s()
        options = JobOptions(events=tmp / "events", out=tmp / f"out-{n}", settings=settings)
        run(options, spark, stream=io.StringIO())
        jobs, tasks = counts()
        print(
            f"run {n}: {jobs - jobs0} jobs, {tasks - tasks0} tasks, "
            f"JVM {jvm_cpu_s(pid) - jvm0:.1f} CPU-s, Python {own_cpu_s() - own0:.1f} CPU-s",
            flush=True,
        )
    spark.stop()


if __name__ == "__main__":
    main()
