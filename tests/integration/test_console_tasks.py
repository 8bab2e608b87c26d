"""Replay tasks and the console's API on a real broker (issue 24): a paced retry that
survives a restart, `amqpbroker retry --rate` following a task, the CSRF defence and
`browse`-only users over real HTTP, and the oldest-message-age metric."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from support.client import QUEUE, connect, reject_with
from support.http import basic_auth, raw_request
from support.metrics import scrape
from support.process import BrokerProcess, console_security, start_broker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ADMIN = basic_auth("admin", "admin-pw")
VIEWER = basic_auth("viewer", "viewer-pw")
CONFIG = console_security()


def dead_letters(broker: BrokerProcess, address: str, count: int) -> None:
    conn = connect(f"amqp://admin:admin-pw@127.0.0.1:{broker.ports['amqp']}")
    sender = conn.create_sender(address, options=QUEUE)
    for i in range(count):
        sender.send(Message(id=f"{address}-{i}", body=f"m{i}", durable=True))
    receiver = conn.create_receiver(address, options=QUEUE)
    for _ in range(count):
        receiver.receive(timeout=5)
        reject_with(receiver, "app:bad", "bad")
    conn.close()


def http(
    broker: BrokerProcess,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    auth: str = ADMIN,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Authorization": auth, **({"X-Requested-By": "test"} if data else {})}
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}{path}",
        data=data,
        method="POST" if data is not None else "GET",
        headers={**sent, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def depth(broker: BrokerProcess, queue: str) -> int:
    status, view = http(broker, f"/api/v1/queues/{queue}")
    return int(view["messages"]) if status == 200 else -1


def test_a_paced_retry_task_resumes_after_a_restart(tmp_path: Path) -> None:
    """Issue 24: the task's definition and progress are in DATA_DIR/tasks.json; after a
    restart it goes on from there and completes; no message is retried twice."""
    durable = CONFIG + "persistence: {enabled: true, sync: false}\n"
    broker = start_broker(tmp_path, durable, log_level="info")
    try:
        dead_letters(broker, "orders", 12)
        status, answer = http(broker, "/api/v1/queues/DLQ.orders/retry", {"rate": 4})
        assert status == 202
        task = answer["task"]
        assert (task["total"], task["status"]) == (12, "running")
        wait_until(lambda: http(broker, f"/api/v1/tasks/{task['id']}")[1]["done"] >= 4)
        assert broker.stop() == 0, broker.log()
        saved = json.loads((broker.data_dir / "tasks.json").read_text())
        assert saved[0]["progress"]["status"] == "running"
        assert 4 <= saved[0]["progress"]["done"] < 12
        broker = start_broker(tmp_path, durable, log_level="info")
        wait_until(
            lambda: http(broker, f"/api/v1/tasks/{task['id']}")[1]["status"] == "completed",
            timeout=10,
        )
        _, done = http(broker, f"/api/v1/tasks/{task['id']}")
        assert (done["done"], done["total"]) == (12, 12)
        assert depth(broker, "orders") == 12
        assert depth(broker, "DLQ.orders") == 0
    finally:
        assert broker.stop() == 0, broker.log()


BROKER_CONFIG = CONFIG


def test_cli_retry_with_a_rate_follows_a_broker_task(broker: BrokerProcess) -> None:
    """Issue 24: `amqpbroker retry --rate` creates a task and waits for it; the summary
    is the one a plain retry prints."""
    dead_letters(broker, "cli", 5)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "amqpbroker",
            "retry",
            "DLQ.cli",
            "--rate",
            "20",
            "--url",
            f"http://admin:admin-pw@127.0.0.1:{broker.ports['http']}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "retried 5 message(s) from DLQ.cli"
    assert "task " in done.stderr
    tasks = http(broker, "/api/v1/tasks")[1]
    assert any(t["queue"] == "DLQ.cli" and t["status"] == "completed" for t in tasks)
    assert depth(broker, "cli") == 5


def test_posts_need_the_csrf_header_and_a_matching_origin(broker: BrokerProcess) -> None:
    """Issue 24: a cross-site form (no custom header) or another Origin is refused."""
    dead_letters(broker, "csrf", 2)
    port = broker.ports["http"]
    target = "/api/v1/queues/DLQ.csrf/purge"
    forged = {"Authorization": ADMIN, "Content-Type": "application/x-www-form-urlencoded"}
    assert raw_request(port, "POST", target, headers=forged, body=b"x=1")[0] == 403
    other = {**forged, "X-Requested-By": "x", "Origin": "http://evil.example"}
    assert raw_request(port, "POST", target, headers=other, body=b"{}")[0] == 403
    assert depth(broker, "DLQ.csrf") == 2
    # raw_request sends `Host: 127.0.0.1`: the same origin is http://127.0.0.1
    same = {"Authorization": ADMIN, "X-Requested-By": "x", "Origin": "http://127.0.0.1"}
    status, _, body = raw_request(port, "POST", target, headers=same, body=b"{}")
    assert (status, json.loads(body)) == (200, {"removed": 2})


def test_browse_only_users_read_but_do_not_act(broker: BrokerProcess) -> None:
    dead_letters(broker, "viewed", 1)
    assert http(broker, "/api/v1/overview", auth=VIEWER)[0] == 200
    assert http(broker, "/api/v1/queues/DLQ.viewed/messages", auth=VIEWER)[0] == 200
    status, error = http(broker, "/api/v1/queues/DLQ.viewed/purge", {}, auth=VIEWER)
    assert status == 403
    assert "'manage'" in error["error"]
    assert depth(broker, "DLQ.viewed") == 1


def test_the_oldest_message_age_is_a_metric_and_a_column(broker: BrokerProcess) -> None:
    """Issue 24: a DLQ that silently ages is visible."""
    dead_letters(broker, "ageing", 1)
    rows = {r["name"]: r for r in http(broker, "/api/v1/overview")[1]}
    assert rows["DLQ.ageing"]["oldest_age_s"] >= 0
    assert rows["DLQ.ageing"]["role"] == "dlq"
    metrics = scrape(broker.ports["http"])
    labels = frozenset({("address", "DLA"), ("queue", "DLQ.ageing")})
    assert metrics["amqpbroker_queue_oldest_message_age_seconds", labels] >= 0
    empty = frozenset({("address", "ageing"), ("queue", "ageing")})
    assert metrics["amqpbroker_queue_oldest_message_age_seconds", empty] == 0
