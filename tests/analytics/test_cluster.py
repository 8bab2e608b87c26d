"""The same job on a Spark standalone cluster via spark-submit (docs/analytics.md).

A master and one worker from the pyspark install, on loopback, started and stopped by
PID here; the job is `spark-submit --master spark://... amqpbroker/analytics/job.py`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from support.jvm import QUICK_JIT
from support.synth_events import generate
from support.waiting import wait_until

# A master, a worker and spark-submit: ~100 s of the two cores; `make test-long` (CI).
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(240)]

SPARK_HOME = Path(pyspark.__file__).parent
JOB = Path(__file__).resolve().parents[2] / "amqpbroker" / "analytics" / "job.py"


def spark_env(tmp: Path) -> dict[str, str]:
    return dict(
        os.environ,
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_WORKER_DIR=str(tmp / "work"),
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_DAEMON_JAVA_OPTS=QUICK_JIT,
    )


def daemon(tmp: Path, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=spark_env(tmp),
        )
    return proc, log


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """spark://127.0.0.1:PORT with one registered worker."""
    procs = []
    try:
        master, master_log = daemon(
            tmp_path,
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
        )
        procs.append(master)

        def master_url() -> str | None:
            assert master.poll() is None, master_log.read_text()
            found = re.search(r"Starting Spark master at (spark://\S+)", master_log.read_text())
            return found.group(1) if found else None

        url = wait_until(master_url, timeout=30, interval=0.1, message="the Spark master")
        worker, worker_log = daemon(
            tmp_path,
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
            *("--cores", "2", "--memory", "2g", "--work-dir", str(tmp_path / "work"), url),
        )
        procs.append(worker)

        def registered() -> bool:
            assert worker.poll() is None, worker_log.read_text()
            return "Successfully registered with master" in worker_log.read_text()

        wait_until(registered, timeout=30, interval=0.1, message="the Spark worker")
        yield url
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_spark_submit_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    """Same results as local: the planted outage's messages, the planted poison."""
    planted = generate(tmp_path / "events", events=4_000, file_events=2_000, poison_payloads=5)
    out = tmp_path / "report"
    result = subprocess.run(
        [
            str(SPARK_HOME / "bin" / "spark-submit"),
            *("--master", cluster, "--executor-memory", "1g"),
            *("--conf", f"spark.driver.extraJavaOptions={QUICK_JIT}"),
            *("--conf", f"spark.executor.extraJavaOptions={QUICK_JIT}"),
            str(JOB),
            *("--events", str(tmp_path / "events"), "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        env=spark_env(tmp_path),
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == planted.events
    assert summary["poison_candidates"] == len(planted.poison_body_hashes)
    redrive = [json.loads(line) for line in (out / "redrive.jsonl").read_text().splitlines()]
    assert {(r["msg_id"], r["queue"]) for r in redrive} == planted.redrive
    assert "redrive candidates:" in result.stdout
