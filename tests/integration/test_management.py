"""The HTTP API, /metrics and the management CLI against the real broker (B-161, CONTRACT)."""

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
from support.client import QUEUE, connect, receive_bodies, settle_modified
from support.metrics import Labels, parse_metrics
from support.process import BrokerProcess, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


BROKER_CONFIG = """
metrics: {artemis-names: true}
address-settings:
  "#": {dead-letter-address: DLA, auto-create-dead-letter-resources: true}
"""


def http(broker: BrokerProcess, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}{path}",
        data=data,
        method="POST" if data else "GET",
        headers={"X-Requested-By": "test"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            kind = response.headers["Content-Type"]
            return response.status, json.loads(raw) if "json" in kind else raw.decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "amqpbroker",
            *args,
            "--url",
            f"http://127.0.0.1:{broker.ports['http']}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def labels(base: dict[str, str], **more: str) -> Labels:
    return frozenset({**base, **more}.items())


def dead_letter(broker: BrokerProcess, address: str, *colors: str) -> None:
    conn = connect(broker.url)
    sender = conn.create_sender(address, options=QUEUE)
    for color in colors:
        sender.send(Message(body=f"{color}-body", properties={"color": color}))
    receiver = conn.create_receiver(address, options=QUEUE)
    for _ in colors:
        receiver.receive(timeout=5)
        receiver.reject()
    conn.close()


def test_ports_json_has_http_and_healthz(broker: BrokerProcess) -> None:
    """CONTRACT: ports.json names the http port; /healthz answers 200."""
    assert http(broker, "/healthz") == (200, {"status": "ok"})


def test_queues_and_browse_show_why_messages_died(broker: BrokerProcess) -> None:
    """B-161/B-079: the DLQ is listed with counters; browsing shows the reasons."""
    dead_letter(broker, "shop", "red", "blue")
    status, queues = http(broker, "/api/v1/queues")
    assert status == 200
    rows = {q["name"]: q for q in queues}
    assert rows["DLQ.shop"]["messages"] == 2
    assert rows["DLQ.shop"]["address"] == "DLA"
    assert rows["shop"]["dead_lettered"] == 2
    assert set(rows["shop"]) == {
        "name",
        "address",
        "routing_type",
        "durable",
        "messages",
        "delivering",
        "scheduled",
        "consumers",
        "added",
        "acknowledged",
        "dead_lettered",
        "expired",
        "killed",
        # issue 19 (B-122, B-125, B-126, B-127, B-128)
        "exclusive",
        "max_consumers",
        "purge_on_no_consumers",
        "groups",
        "dispatching",
        "paging",  # B-151 PAGE (issue 23)
        "paged_messages",
        "paged_bytes",
        "paged_lost",  # lost to damaged page files (issue 23 fix 3)
    }
    assert rows["shop"]["paging"] is False
    status, messages = http(broker, "/api/v1/queues/DLQ.shop/messages?filter=color%3D'red'")
    assert status == 200
    [red] = messages
    assert red["message_annotations"]["x-opt-DLQ-REASON"] == "rejected"
    assert red["application_properties"] == {"color": "red"}
    assert red["body_preview"] == "red-body"
    status, one = http(broker, "/api/v1/queues/DLQ.shop")
    assert one["filter"] == "_AMQ_ORIG_ADDRESS = 'shop'"
    assert one["settings"]["dead-letter-address"] == "DLA"


def test_retry_sends_dead_letters_back(broker: BrokerProcess) -> None:
    """B-161 retry: back to the original queue; a consumer gets them again."""
    dead_letter(broker, "retryme", "a", "b")
    assert http(broker, "/api/v1/queues/DLQ.retryme/retry", {"filter": "color = 'a'"}) == (
        200,
        {"retried": 1},
    )
    conn = connect(broker.url)
    assert receive_bodies(conn.create_receiver("retryme", options=QUEUE), 1) == ["a-body"]
    conn.close()


def test_errors_are_json_with_status_codes(broker: BrokerProcess) -> None:
    """CONTRACT: JSON errors, 404 unknown queue, 400 bad input. Makes its own queue: the
    test runs alone or on another worker than the module's earlier tests."""
    dead_letter(broker, "errshop", "red")
    status, body = http(broker, "/api/v1/queues/ghost/purge", {})
    assert (status, body) == (404, {"error": "queue ghost does not exist"})
    status, body = http(broker, "/api/v1/queues/DLQ.errshop/messages?filter=color%20%3D")
    assert status == 400
    assert "Invalid filter" in body["error"]
    status, body = http(broker, "/api/v1/queues/DLQ.errshop/move", {"filter": None})
    assert status == 400


def test_metrics_expose_contract_and_artemis_names(broker: BrokerProcess) -> None:
    """CONTRACT "Metrics": queue gauges and counters by reason; Artemis names too."""
    dead_letter(broker, "metered", "x")
    status, text = http(broker, "/metrics")
    assert status == 200
    assert (
        'amqpbroker_queue_messages{address="DLA",queue="DLQ.metered",routing_type="MULTICAST"} 1.0'
    ) in text
    assert (
        'amqpbroker_queue_messages_dead_lettered_total{address="metered",'
        'queue="metered",reason="rejected"} 1.0'
    ) in text
    assert "amqpbroker_connections " in text
    assert 'amqpbroker_build_info{version="' in text
    assert 'artemis_message_count{address="DLA",broker="test-broker",queue="DLQ.metered"}' in text


def cli_at(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The management CLI with `--url` exactly as given."""
    return subprocess.run(
        [sys.executable, "-m", "amqpbroker", *args, "--url", url],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("path", ["/", "/api", "/api/", "/api/v1", "/api/v1/", "//"])
def test_cli_url_with_the_api_path_or_a_trailing_slash_reaches_the_api(
    broker: BrokerProcess, path: str
) -> None:
    """User pass: `--url http://HOST:PORT/api` (or `/api/v1`, a trailing slash) was
    requested as `/api/api/v1/queues`, a 404; the API's own prefix and trailing slashes
    are taken as the user meant them."""
    dead_letter(broker, "urlpath", "red")
    result = cli_at(f"http://127.0.0.1:{broker.ports['http']}{path}", "queues", "--json")
    assert result.returncode == 0, result.stderr
    assert "DLQ.urlpath" in {q["name"] for q in json.loads(result.stdout)}


def test_cli_url_that_is_not_the_api_says_what_url_should_be(broker: BrokerProcess) -> None:
    """User pass: a path the API is not under answered `no such console file ... (HTTP
    404)`; now the one line says what --url is. A query is refused before any request."""
    base = f"http://127.0.0.1:{broker.ports['http']}"
    wrong = cli_at(f"{base}/console", "queues")
    assert wrong.returncode == 1
    assert "no management API at" in wrong.stderr
    assert "--url is the broker's HTTP address, http://HOST:PORT" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    query = cli_at(f"{base}/?queue=x", "queues")
    assert query.returncode == 1
    assert "--url must look like http://HOST:PORT" in query.stderr
    missing = cli_at(base, "messages", "no-such-queue")  # the broker's own 404: as it was
    assert missing.returncode == 1
    assert "no management API" not in missing.stderr


def test_cli_queues_messages_move_purge(broker: BrokerProcess, tmp_path: Path) -> None:
    """CONTRACT "Command line": tables by default, --json, exit codes, one-line errors."""
    dead_letter(broker, "clishop", "red", "green", "blue")
    dead_letter(broker, "clitarget", "white")  # its own target: the test runs alone too
    table = cli(broker, "queues")
    assert table.returncode == 0
    assert "DLQ.clishop" in table.stdout
    browse = cli(broker, "messages", "DLQ.clishop", "--json")
    ids = [m["msg_id"] for m in json.loads(browse.stdout)]
    assert len(ids) == 3
    redrive = tmp_path / "redrive.jsonl"
    redrive.write_text(json.dumps({"msg_id": ids[0], "reason": "rejected"}) + "\n")
    retried = cli(broker, "retry", "DLQ.clishop", "--ids", str(redrive))
    assert retried.returncode == 0
    assert retried.stdout.strip() == "retried 1 message(s) from DLQ.clishop"
    paced = cli(broker, "retry", "DLQ.clishop", "--filter", "color = 'green'", "--rate", "50")
    assert "retried 1 message(s)" in paced.stdout
    moved = cli(broker, "move", "DLQ.clishop", "--to-queue", "DLQ.clitarget", "--json")
    assert json.loads(moved.stdout) == {"moved": 1}
    purged = cli(broker, "purge", "DLQ.clitarget", "--filter", "color = 'blue'")
    assert purged.returncode == 0
    assert purged.stdout.strip() == "removed 1 message(s) from DLQ.clitarget"
    missing = cli(broker, "purge", "no-such-queue")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "amqpbroker: queue no-such-queue does not exist (HTTP 404)"
    assert "Traceback" not in missing.stderr


def test_cli_reports_an_unreachable_broker_in_one_line() -> None:
    """CONTRACT: exit 1 with a one-line message, never a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "amqpbroker", "queues", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("amqpbroker: cannot reach the broker at")
    assert len(result.stderr.strip().splitlines()) == 1


def test_metrics_after_a_scripted_scenario(tmp_path: Path) -> None:
    """CONTRACT "Metrics": exact counters after send, fail, dead-letter, expire."""
    running = start_broker(
        tmp_path,
        """
        message-expiry-scan-period: 50
        address-settings:
          "#": {dead-letter-address: DLA, auto-create-dead-letter-resources: true,
                max-delivery-attempts: 2}
        """,
    )
    try:
        conn = connect(running.url)
        sender = conn.create_sender("scen", options=QUEUE)
        for body in ("ok", "poison"):
            sender.send(Message(body=body))
        sender.send(Message(body="stale", expiry_time=1.0))  # long expired
        receiver = conn.create_receiver("scen", credit=1, options=QUEUE)
        assert receiver.receive(timeout=5).body == "ok"
        receiver.accept()
        for _ in range(2):  # the second failure dead-letters (max-delivery-attempts 2)
            assert receiver.receive(timeout=5).body == "poison"
            settle_modified(receiver)
        conn.close()
        _, text = http(running, "/metrics")
        values = parse_metrics(text)
        q = {"address": "scen", "queue": "scen"}
        assert values["amqpbroker_queue_messages_added_total", labels(q)] == 3
        assert values["amqpbroker_queue_messages_acknowledged_total", labels(q)] == 1
        assert values["amqpbroker_queue_messages_expired_total", labels(q)] == 1
        assert (
            values[
                "amqpbroker_queue_messages_dead_lettered_total", labels(q, reason="max-attempts")
            ]
            == 1
        )
        assert (
            values[
                "amqpbroker_queue_deliveries_returned_total", labels(q, outcome="modified-failed")
            ]
            == 1
        )
        assert values["amqpbroker_queue_messages", labels(q, routing_type="ANYCAST")] == 0
        dlq = {"address": "DLA", "queue": "DLQ.scen", "routing_type": "MULTICAST"}
        assert values["amqpbroker_queue_messages", labels(dlq)] == 1
        assert values["amqpbroker_address_routed_messages_total", labels({"address": "scen"})] == 3
        assert values["amqpbroker_connections_opened_total", labels({})] >= 1
    finally:
        assert running.stop() == 0


def test_bad_json_is_400(broker: BrokerProcess) -> None:
    """CONTRACT: a body that is not JSON -> 400 with a JSON error."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/DLQ.shop/purge",
        data=b"{not json",
        method="POST",
        headers={"X-Requested-By": "test"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400
    assert "invalid JSON" in json.loads(info.value.read())["error"]
    info.value.close()


def test_unknown_route_is_404(broker: BrokerProcess) -> None:
    assert http(broker, "/api/v1/nothing-here")[0] == 404


def test_a_rebound_host_name_is_refused_on_a_loopback_server(broker: BrokerProcess) -> None:
    """DNS rebinding (issue 15 attack): a page on a name made to resolve to 127.0.0.1
    sends its own Host and a matching Origin; with security off the purge went through.
    A loopback-bound server answers only loopback names (CONTRACT: HTTP on `http.bind`)."""
    from support.http import raw_request

    conn = connect(broker.url)
    conn.create_sender("rebind", options=QUEUE).send(Message(body="keep me"))
    conn.close()
    port = broker.ports["http"]
    forged = {
        "Host": f"rebind.example:{port}",
        "Origin": f"http://rebind.example:{port}",
        "X-Requested-By": "page",
    }
    status, _, body = raw_request(port, "POST", "/api/v1/queues/rebind/purge", headers=forged)
    assert status == 403, body
    assert b"DNS rebinding" in body
    status, _, _ = raw_request(port, "GET", "/api/v1/queues", headers={"Host": "rebind.example"})
    assert status == 403  # reading messages is refused too
    status, _, _ = raw_request(port, "GET", "/healthz", headers={"Host": ""})
    assert status == 403  # an empty Host names no loopback host either
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost."):
        status, _, _ = raw_request(port, "GET", "/healthz", headers={"Host": host})
        assert status == 200, host
    assert http(broker, "/api/v1/queues/rebind")[1]["messages"] == 1
