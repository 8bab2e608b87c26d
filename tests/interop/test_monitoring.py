"""The monitoring kit in docker/ against a running broker (issue 21): promtool checks the
rules and a live scrape, every metric a dashboard panel or alert rule names is exported,
and a real Prometheus (Debian package) scrapes the broker and answers queries."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.client import QUEUE, connect, reject_with, send
from support.interop import ROOT, ensure_apt
from support.metrics import parse_metrics
from support.process import BrokerProcess, start_broker
from support.waiting import wait_until

from amqpbroker.metrics import names

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

DOCKER = ROOT / "docker"
RULES = DOCKER / "prometheus" / "alerts.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "amqpbroker.json"
NAME = re.compile(r"\b(?:amqpbroker|artemis)_[a-z_]+\b")
PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself, never exported by a target


@pytest.fixture(scope="module")
def promtool() -> str:
    """Debian's prometheus package brings promtool; installed here when root and missing."""
    ensure_apt("prometheus", probes=("/usr/bin/promtool", "/usr/bin/prometheus"))
    return "/usr/bin/promtool"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with a journal, some depth and one dead letter, so labelled series exist."""
    running = start_broker(
        tmp_path_factory.mktemp("monitoring"),
        """
        persistence:
          enabled: true
        event-log:
          enabled: true
        metrics:
          artemis-names: true
        address-settings:
          "#": {dead-letter-address: DLA, auto-create-dead-letter-resources: true}
        """,
    )
    conn = connect(running.url)
    send(conn, "mon.depth", "a", caps=("queue",))
    send(conn, "mon.depth", "b", caps=("queue",))
    send(conn, "mon.dead", "poison", caps=("queue",))
    receiver = conn.create_receiver("mon.dead", options=QUEUE)
    receiver.receive(timeout=10)
    reject_with(receiver, "app:poison", "test")
    conn.close()
    yield running
    assert running.stop() == 0, running.log()


def scrape_text(broker: BrokerProcess) -> str:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def exported(broker: BrokerProcess) -> set[str]:
    """Every sample name and family name the broker exports right now."""
    from prometheus_client.parser import text_string_to_metric_families

    text = scrape_text(broker)
    names = {name for name, _ in parse_metrics(text)}
    names |= {family.name for family in text_string_to_metric_families(text)}
    return names


def used_by_kit() -> dict[str, set[str]]:
    """Metric names per dashboard panel / alert rule (histograms through `_bucket`)."""
    used: dict[str, set[str]] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            used.setdefault(f"panel {panel['title']!r}", set()).update(NAME.findall(target["expr"]))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            names = set(NAME.findall(rule["expr"])) | (set(re.findall(r"\bup\b", rule["expr"])))
            used[f"rule {rule['alert']}"] = names
    return used


def test_promtool_checks_the_alert_rules(promtool: str) -> None:
    """Issue 21: the shipped rules parse and type-check with Debian's promtool."""
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


def test_promtool_checks_a_live_scrape(promtool: str, broker: BrokerProcess) -> None:
    """Issue 21: `promtool check metrics` on a real scrape finds nothing to lint but the
    Artemis plugin's own `*_count` gauge names, kept as Artemis spells them so that an
    Artemis dashboard works unchanged (metrics.artemis-names)."""
    done = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape_text(broker),
        capture_output=True,
        text=True,
        timeout=30,
    )
    lint = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    artemis_count = re.compile(
        r"^artemis_[a-z_]+_count non-histogram and non-summary metrics"
        r' should not have "_count" suffix$'
    )
    assert [line for line in lint if not artemis_count.match(line)] == []
    assert len(lint) == sum(name.endswith("_count") for name in names.ARTEMIS.values())


def test_every_metric_the_kit_uses_is_exported(broker: BrokerProcess) -> None:
    """A dashboard panel or an alert on a name the broker does not export shows nothing
    and never fires: each name must be in a live scrape (`up` is Prometheus's own)."""
    have = exported(broker) | PROMETHEUS_OWN
    used = used_by_kit()
    assert len(used) == 13 + 8
    missing = {where: sorted(names - have) for where, names in used.items() if names - have}
    assert missing == {}
    assert all(used.values())  # every panel and rule names at least one metric


def test_artemis_names_with_their_meaning(broker: BrokerProcess) -> None:
    """metrics.artemis-names (issue 21): every Artemis plugin name that applies is exported
    with help text saying what it measures, and the two added here carry real values."""
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(scrape_text(broker))}
    assert len(names.ARTEMIS) == 13
    for key, name in names.ARTEMIS.items():
        assert families[name].documentation == names.ARTEMIS_HELP[key]
    samples = parse_metrics(scrape_text(broker))
    depth = frozenset({("broker", "test-broker"), ("address", "mon.depth"), ("queue", "mon.depth")})
    assert samples["artemis_message_count", depth] == 2
    assert samples["artemis_persistent_size", depth] > 2  # two encoded messages
    opened = samples["artemis_total_connection_count", frozenset({("broker", "test-broker")})]
    assert opened >= 1
    assert opened == samples["amqpbroker_connections_opened_total", frozenset()]


def test_compose_refers_to_files_that_exist() -> None:
    """compose.yaml cannot run here (no container engine): it must at least build from the
    Dockerfile that exists and mount files that exist, on the ports the image serves."""
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    build = compose["services"]["broker"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert (context / build["dockerfile"]).is_file()
    for service in ("prometheus", "grafana"):
        for volume in compose["services"][service]["volumes"]:
            assert (DOCKER / volume.split(":")[0]).exists(), volume
    scrape = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    target = scrape["scrape_configs"][0]["static_configs"][0]["targets"][0]
    image_config = yaml.safe_load((DOCKER / "broker.yaml").read_text())
    assert target == "broker:" + image_config["http"]["bind"].rsplit(":", 1)[1]
    assert "EXPOSE 5672 8161" in (context / build["dockerfile"]).read_text()


@pytest.fixture
def prometheus(promtool: str, broker: BrokerProcess, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus on 127.0.0.1:0 (it reports the port it got in its log) scraping
    the broker every second, with the shipped alert rules loaded."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "amqpbroker",
                        "static_configs": [{"targets": [f"127.0.0.1:{broker.ports['http']}"]}],
                    }
                ],
            }
        )
    )
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                "/usr/bin/prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                "--web.listen-address=127.0.0.1:0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        listening = re.compile(r'msg="Listening on" address=127\.0\.0\.1:(\d+)')

        def port() -> str | None:
            assert proc.poll() is None, log.read_text()
            found = listening.search(log.read_text())
            return found.group(1) if found else None

        base = f"http://127.0.0.1:{wait_until(port, timeout=30, message='prometheus listening')}"

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as response:
                    return bool(response.status == 200)
            except OSError:  # 503 while the TSDB opens
                return False

        wait_until(ready, timeout=30, message="prometheus ready")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_real_prometheus_reads_depth_and_dead_letters(prometheus: str) -> None:
    """Issue 21: the target is up, and a queue's depth and its dead-letter count come back
    through Prometheus's query API (B-090's counters, CONTRACT.md "Metrics")."""

    def value(promql: str) -> float | None:
        result = query(prometheus, promql)
        return float(result[0]["value"][1]) if result else None

    wait_until(lambda: value('up{job="amqpbroker"}') == 1.0, timeout=30, message="target up")
    assert value('amqpbroker_queue_messages{queue="mon.depth"}') == 2.0
    dead = 'sum(amqpbroker_address_messages_dead_lettered_total{address="mon.dead"})'
    assert value(dead) == 1.0
    assert value('artemis_message_count{queue="mon.depth"}') == 2.0
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as response:
        groups = json.loads(response.read())["data"]["groups"]
    assert [len(g["rules"]) for g in groups] == [8]
