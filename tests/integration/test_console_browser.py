"""The operator's web console in a real browser (issue 24, "Tests"): headless Chromium
through Selenium against a broker with traffic and dead letters (B-046 rejected, B-079
DLQ annotations, B-161 retry/purge). One browser session for the module.

Set AMQPBROKER_SCREENSHOTS=DIR to keep the overview and DLQ screenshots (docs/ has them).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from support.browser import authorize, chromium, statuses, wait_for, wait_text
from support.client import QUEUE, connect, reject_with
from support.http import basic_auth
from support.process import BrokerProcess, console_security, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ADMIN = basic_auth("admin", "admin-pw")
VIEWER = basic_auth("viewer", "viewer-pw")
NO_VALUE = "\N{EN DASH}"  # what the console shows for no value yet
INJECTION = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    directory = tmp_path_factory.mktemp("console")
    report = directory / "report.html"
    report.write_text("<html><body><h1>Dead-letter triage</h1></body></html>")
    running = start_broker(
        directory,
        f'http: {{bind: "127.0.0.1:0", sample-interval: 200, analyze-report: "{report}"}}\n'
        + console_security(),
        log_level="info",
    )
    traffic(running)
    yield running
    assert running.stop() == 0, running.log()


def traffic(broker: BrokerProcess) -> None:
    """orders: 6 sent, 4 of them and a hostile one rejected into DLQ.orders; invoices:
    3 dead letters; payments: 5 binary messages."""
    conn = connect(f"amqp://admin:admin-pw@127.0.0.1:{broker.ports['amqp']}")
    orders = conn.create_sender("orders", options=QUEUE)
    orders.send(
        Message(
            id="hostile",
            subject=INJECTION,
            body=INJECTION,
            properties={"<script>window.__pwned=3</script>": INJECTION, "color": "evil"},
        )
    )
    for i in range(6):
        color = "red" if i % 2 else "green"
        orders.send(Message(id=f"ord-{i}", body=f"order {i}", properties={"color": color}))
    receiver = conn.create_receiver("orders", options=QUEUE)
    for _ in range(5):  # the hostile one and ord-0..3; ord-4 and ord-5 stay in orders
        receiver.receive(timeout=5)
        reject_with(receiver, "app:invalid-order", "price <b>missing</b>")
    receiver.close()
    invoices = conn.create_sender("invoices", options=QUEUE)
    for i in range(3):
        invoices.send(Message(id=f"inv-{i}", body=f"invoice {i}"))
    receiver = conn.create_receiver("invoices", options=QUEUE)
    for _ in range(3):
        receiver.receive(timeout=5)
        reject_with(receiver, "app:late", "too late")
    receiver.close()
    payments = conn.create_sender("payments", options=QUEUE)
    for i in range(5):
        payments.send(Message(id=i, body=b"\x00\x01\xfe" + bytes([i])))
    conn.close()


def api(broker: BrokerProcess, path: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}{path}", headers={"Authorization": ADMIN}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def browser(broker: BrokerProcess) -> Iterator[WebDriver]:
    session = chromium()
    authorize(session, ADMIN)
    yield session
    session.quit()


def console(broker: BrokerProcess) -> str:
    return f"http://127.0.0.1:{broker.ports['http']}/console/"


def open_queue(browser: WebDriver, broker: BrokerProcess, name: str) -> None:
    browser.get(console(broker) + "#/queue/" + name)
    browser.refresh()  # a fresh page even when only the fragment changed
    wait_text(browser, "#queue-name", name)
    wait_for(browser, "#messages tbody tr[data-msg-id]")


def rows(browser: WebDriver, table: str) -> dict[str, list[str]]:
    """A queue table's rows by queue name, read in one script (the table is redrawn
    every few seconds: reading cell by cell could straddle a redraw)."""
    found: list[list[Any]] = browser.execute_script(
        """
        return [...document.querySelectorAll(arguments[0])].map((row) =>
          [row.dataset.queue, [...row.querySelectorAll("td")].map((td) => td.innerText)]);
        """,
        f"#{table} tbody tr[data-queue]",
    )
    return {name: cells for name, cells in found}  # in the table's order


def screenshot(browser: WebDriver, name: str) -> None:
    directory = os.environ.get("AMQPBROKER_SCREENSHOTS")
    if directory:
        browser.save_screenshot(str(Path(directory) / name))


def test_the_overview_shows_queues_and_dead_letter_queues_apart(
    browser: WebDriver, broker: BrokerProcess
) -> None:
    """Issue 24 "Overview": broker facts, DLQs in their own table, depth, filter, sort."""
    browser.get(console(broker))
    wait_text(browser, "#broker-name", "test-broker")
    wait_for(browser, "#dead-queues tr[data-queue='DLQ.orders']")
    dead = rows(browser, "dead-queues")
    assert set(dead) == {"DLQ.orders", "DLQ.invoices"}
    assert dead["DLQ.orders"][0].startswith("DLQ.orders")
    assert "DLQ" in dead["DLQ.orders"][0]
    assert dead["DLQ.orders"][4] == "5"  # depth
    assert set(rows(browser, "queues")) == {"orders", "invoices", "payments"}
    assert browser.find_element("css selector", "#broker-facts").text.count("connections") == 1
    # rates appear once the broker has two samples
    WebDriverWait(browser, 10).until(lambda s: rows(s, "queues")["payments"][8] != NO_VALUE)
    screenshot(browser, "console-overview.png")
    browser.find_element("css selector", "#queue-filter").send_keys("pay")
    WebDriverWait(browser, 5).until(lambda s: set(rows(s, "queues")) == {"payments"})
    assert rows(browser, "dead-queues") == {}
    browser.find_element("css selector", "#queue-filter").clear()
    browser.find_element("css selector", "#queue-filter").send_keys(" ")
    wait_for(browser, "#queues tr[data-queue='orders']")
    browser.find_element("css selector", "#queues th[data-key='messages']").click()
    wait_for(browser, "#queues th.sorted.asc[data-key='messages']")
    browser.find_element("css selector", "#queues th[data-key='messages']").click()
    wait_for(browser, "#queues th.sorted.desc[data-key='messages']")
    ordered = list(rows(browser, "queues"))
    assert ordered[0] == "payments", ordered


def test_the_header_links_the_analyze_report(browser: WebDriver, broker: BrokerProcess) -> None:
    """Issue 24: with `http.analyze-report` configured the header links the report."""
    browser.get(console(broker))
    link = wait_for(browser, "#report-link:not([hidden])")
    href = link.get_attribute("href")
    assert href == console(broker) + "report"
    browser.get(href)
    wait_text(browser, "h1", "Dead-letter triage")


def test_a_dlq_page_shows_why_messages_died_and_escapes_everything(
    browser: WebDriver, broker: BrokerProcess
) -> None:
    """Issue 24 "Queue page" and "Safe by construction": reasons, error condition and
    description in the table; a message whose properties and body hold markup and
    scripts shows them as text, and none of them runs."""
    open_queue(browser, broker, "DLQ.orders")
    table = browser.find_element("css selector", "#messages").text
    assert "rejected" in table
    assert "app:invalid-order" in table
    assert "price <b>missing</b>" in table  # as text, not bold
    assert browser.find_elements("css selector", "#messages b") == []
    hostile = wait_text(browser, "#messages tbody tr", "hostile")
    hostile.find_element("css selector", "a.open").click()
    detail = wait_for(browser, "#message-detail")
    assert INJECTION in detail.find_element("css selector", "#detail-body").text
    assert "<script>window.__pwned=3</script>" in detail.text
    assert browser.find_elements("css selector", "#view img, #view script") == []
    assert browser.execute_script("return window.__pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - raises when no alert is open
    first = browser.find_elements("css selector", "#messages a.open")[0]
    first.click()
    wait_text(browser, "#detail-annotations", "x-opt-ORIG-ADDRESS")
    screenshot(browser, "console-dlq.png")


def test_filter_then_retry_a_selection_back_to_the_original_queue(
    browser: WebDriver, broker: BrokerProcess
) -> None:
    """Issue 24: a selector narrows the browse; two selected messages are retried after
    a confirmation that says 2; they arrive on `orders` (B-161 retry)."""
    open_queue(browser, broker, "DLQ.orders")
    browser.find_element("css selector", "#selector").send_keys("color = 'red'")
    browser.find_element("css selector", "#apply-filter").click()
    wait_text(browser, "#page-info", "of 2")
    assert len(browser.find_elements("css selector", "#messages input.pick")) == 2
    for i in range(2):  # each click redraws the rows: find the box again
        browser.find_elements("css selector", "#messages input.pick")[i].click()
    wait_text(browser, "#scope", "2 selected")
    browser.find_element("css selector", "#retry").click()
    dialog = wait_for(browser, "dialog#confirm[open]")
    assert "Retry 2 messages from DLQ.orders" in dialog.text
    dialog.find_element("css selector", "#confirm-ok").click()
    wait_text(browser, "#outcome", "retried 2")
    wait_text(browser, "#page-info", "0 messages")
    arrived = api(broker, "/api/v1/queues/orders/messages")
    ids = {m["properties"].get("message-id") for m in arrived}
    assert {"ord-1", "ord-3"} <= ids
    assert api(broker, "/api/v1/queues/DLQ.orders")["messages"] == 3


def test_a_retry_with_a_rate_runs_as_a_task_with_progress(
    browser: WebDriver, broker: BrokerProcess
) -> None:
    """Issue 24 "Replay as a managed task": all that match, at a rate, as a task that
    the console lists until it completes."""
    open_queue(browser, broker, "DLQ.invoices")
    browser.find_element("css selector", "#select-all").click()
    wait_text(browser, "#scope", "all 3 that match")
    browser.find_element("css selector", "#retry-rate").send_keys("20")
    browser.find_element("css selector", "#retry").click()
    dialog = wait_for(browser, "dialog#confirm[open]")
    assert "Retry 3 messages from DLQ.invoices" in dialog.text
    assert "20 msg/s, as a task" in dialog.text
    dialog.find_element("css selector", "#confirm-ok").click()
    wait_text(browser, "#outcome", "task")
    wait_text(browser, "#tasks tr[data-task]", "completed", timeout=15)
    wait_text(browser, "#tasks tr[data-task]", "3/3")
    assert api(broker, "/api/v1/queues/invoices")["messages"] == 3


def test_purge_asks_first_and_says_how_many(browser: WebDriver, broker: BrokerProcess) -> None:
    """Issue 24: purge behind a confirmation; Cancel purges nothing."""
    open_queue(browser, broker, "payments")
    body_cell = browser.find_element("css selector", "#messages td.body-cell").text
    assert body_cell.startswith("0001fe")  # binary as hex
    browser.find_element("css selector", "#select-all").click()
    browser.find_element("css selector", "#purge").click()
    dialog = wait_for(browser, "dialog#confirm[open]")
    assert "Purge 5 messages from payments" in dialog.text
    dialog.find_element("css selector", "#confirm-cancel").click()
    WebDriverWait(browser, 5).until(lambda s: not s.find_elements("css selector", "dialog[open]"))
    assert api(broker, "/api/v1/queues/payments")["messages"] == 5
    browser.find_element("css selector", "#purge").click()
    wait_for(browser, "dialog#confirm[open]").find_element("css selector", "#confirm-ok").click()
    wait_text(browser, "#outcome", "purged 5")
    assert api(broker, "/api/v1/queues/payments")["messages"] == 0


def test_no_credentials_is_401_and_browse_only_has_no_action_buttons(
    browser: WebDriver, broker: BrokerProcess
) -> None:
    """Issue 24: the console is behind the same basic auth; `browse` without `manage`
    sees the queues but no selection boxes and no retry/move/purge."""
    try:
        authorize(browser, None)
        statuses(browser, console(broker))  # forget earlier ones
        browser.get(console(broker))
        assert statuses(browser, console(broker)) == [401]
        assert browser.find_elements("css selector", "#view") == []
        authorize(browser, VIEWER)
        open_queue(browser, broker, "DLQ.orders")
        wait_text(browser, "#user", "viewer (read-only)")
        assert browser.find_elements("css selector", "#actions, #retry, #purge, #move") == []
        assert browser.find_elements("css selector", "#messages input[type=checkbox]") == []
    finally:
        authorize(browser, ADMIN)


def test_the_page_sends_a_content_security_policy(broker: BrokerProcess) -> None:
    request = urllib.request.Request(console(broker), headers={"Authorization": ADMIN})
    with urllib.request.urlopen(request, timeout=10) as response:
        policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
