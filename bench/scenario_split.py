"""Where a scenario's CPU goes, process by process (issue 20): queue against redelivery.

    python3 bench/scenario_split.py                       # N=50000, 3 rounds, the .venv
    PYTHON=/tmp/cv/bin/python N=50000 ROUNDS=3 python3 bench/scenario_split.py
    PYTHONPATH=/tmp/T SCENARIOS=queue,redelivery python3 bench/scenario_split.py

Starts the broker on the shipped config (ports 0), sends a 5,000-message queue warm-up,
then runs the SCENARIOS (default queue, redelivery, redelivery-released) in turn, ROUNDS
times, with the shared harness's C load generator. Around each run it reads utime +
stime of every thread of the broker's loop process (the loop; the journal writer thread)
and of its event-log writer process, which it lets finish what the run gave it (its
pending events at 0) before the second reading: the writer's whole work for the run,
not only what fell inside it. The load generators' CPU is amqp-bench's (their
getrusage). While a run goes, the bench queue's depth (ready + scheduled + delivering,
`/metrics`) is sampled every 0.1 s, and the loop process's minor page faults a message
are counted (`loop_faults`). One JSON line a run, then the medians in
microseconds a message. CPU per message is the point; msg/s follows the machine's load.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The shared harness beside the repo, or where SHARED_BENCH says (a git worktree elsewhere).
BENCH = Path(os.environ.get("SHARED_BENCH", REPO.parent / "shared" / "bench")) / "amqp-bench"
CGEN = "/tmp/bench-cgen/amqp-cgen"
TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> float:
    """utime + stime of all the process's threads, seconds (0 if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def faults(pid: int) -> int:
    """Minor page faults of the process so far (all its threads; 0 if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(raw[raw.rindex(")") + 2 :].split()[7])


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            if int(raw[raw.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def metric(http: int, name: str, queues: str = "") -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith(name + ("{" if queues else " ")) and queues in line:
            total += int(float(line.split()[-1]))
    return total


def main() -> int:
    n = int(os.environ.get("N", "50000"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    scenarios = os.environ.get("SCENARIOS", "queue,redelivery,redelivery-released").split(",")
    python = os.environ.get("PYTHON", str(REPO / ".venv" / "bin" / "python"))
    out = Path(tempfile.mkdtemp(prefix="amqpbroker-split."))
    config = (REPO / "config" / "broker.yaml").read_text()
    config = config.replace("amqp://127.0.0.1:5672", "amqp://127.0.0.1:0")
    (out / "broker.yaml").write_text(config.replace("127.0.0.1:8161", "127.0.0.1:0"))
    with open(out / "broker.log", "w") as log:
        broker = subprocess.Popen(
            [
                python,
                "-m",
                "amqpbroker",
                "run",
                "--config",
                "broker.yaml",
                "--data-dir",
                "data",
                "--log-level",
                "warning",
            ],
            cwd=out,
            stdout=log,
            stderr=log,
        )
    try:
        ports_file = out / "data" / "ports.json"
        deadline = time.monotonic() + 120
        while not (ports_file.exists() and ports_file.stat().st_size):
            if broker.poll() is not None or time.monotonic() > deadline:
                print((out / "broker.log").read_text(), file=sys.stderr)
                return 1
            time.sleep(0.2)
        ports = json.loads(ports_file.read_text())
        amqp, http = ports["amqp"], ports["http"]

        def run(scenario: str, count: int, jsonl: Path) -> dict[str, Any]:
            writers = children(broker.pid)
            before = (cpu(broker.pid), sum(cpu(w) for w in writers), faults(broker.pid))
            depth: list[int] = []
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.1):
                    with contextlib.suppress(OSError):
                        depth.append(metric(http, "amqpbroker_queue_messages", "bench."))

            sampler = threading.Thread(target=sample)
            sampler.start()
            subprocess.run(
                [
                    str(BENCH),
                    "--url",
                    f"amqp://127.0.0.1:{amqp}",
                    "--label",
                    "amqpbroker",
                    "--flavor",
                    "artemis",
                    "--client",
                    "c",
                    "--cgen",
                    CGEN,
                    "--scenario",
                    scenario,
                    "-n",
                    str(count),
                    "--reps",
                    "1",
                    "--idle-timeout",
                    "120",
                    "--quiet",
                    "--jsonl",
                    str(jsonl),
                    "--broker-pid",
                    str(broker.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
            done.set()
            sampler.join()
            for _ in range(600):  # the writer's work for this run, all of it
                if metric(http, "amqpbroker_event_log_pending_events") == 0:
                    break
                time.sleep(0.1)
            loop = cpu(broker.pid) - before[0]
            loop_faults = faults(broker.pid) - before[2]
            writer = sum(cpu(w) for w in writers) - before[1]
            record = json.loads(jsonl.read_text().splitlines()[-1])
            return {
                "scenario": scenario,
                "status": record.get("status"),
                "msgs_per_s": record.get("msgs_per_s"),
                "loop_us": round(loop / count * 1e6, 1),
                "writer_us": round(writer / count * 1e6, 1),
                "producer_us": round((record["cpu_s"].get("producer") or 0) / count * 1e6, 1),
                "consumer_us": round((record["cpu_s"].get("consumers") or 0) / count * 1e6, 1),
                "max_depth": max(depth, default=0),
                "loop_faults": round(loop_faults / count, 2),
            }

        run("queue", 5000, out / "warmup.jsonl")
        rows = []
        for r in range(rounds):
            for scenario in scenarios:
                row = run(scenario, n, out / f"{scenario}.{r}.jsonl")
                row["all_us"] = round(
                    row["loop_us"] + row["writer_us"] + row["producer_us"] + row["consumer_us"], 1
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
        print(f"medians, microseconds a message (N={n}, {rounds} rounds; {out}):")
        for scenario in scenarios:
            mine = [row for row in rows if row["scenario"] == scenario]
            keys = (
                "loop_us",
                "writer_us",
                "producer_us",
                "consumer_us",
                "all_us",
                "max_depth",
                "loop_faults",
            )
            print(
                f"  {scenario:20s}",
                " ".join(f"{k}={statistics.median(row[k] for row in mine):g}" for k in keys),
            )
    finally:
        broker.terminate()
        broker.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
