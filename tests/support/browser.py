"""Headless Chromium through Selenium for the console's browser tests (issue 24).

Debian's `chromium` and `chromium-driver` (installed by `make test` through
tests/support/install-browser.sh); Selenium never downloads a driver here. Basic-auth
credentials go in an `Authorization` header set over the DevTools protocol, for the
page and for every fetch it makes, as a browser sends them once the user has typed them.
"""

from __future__ import annotations

import json
import shutil

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

WINDOW = (1400, 900)
# The console redraws its refreshed parts every few seconds: an element found just before
# a redraw is gone after it, so waits look again.
STALE = (StaleElementReferenceException,)


def chromium() -> WebDriver:
    """A headless Chromium session, or a test failure that says what is missing."""
    binary = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.fail(
            "chromium and chromium-driver are needed for the console tests: `make test` "
            "installs them (tests/support/install-browser.sh, as root)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # response statuses
    session = webdriver.Chrome(options=options, service=Service(driver))
    session.set_page_load_timeout(20)
    session.execute_cdp_cmd("Network.enable", {})
    return session


def authorize(session: WebDriver, authorization: str | None) -> None:
    """Send `authorization` (None: no credentials) with every later request."""
    headers = {} if authorization is None else {"Authorization": authorization}
    session.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})


def statuses(session: WebDriver, url: str) -> list[int]:
    """The HTTP statuses the browser received for `url` since the last call (from its
    DevTools performance log: a 401 page that the browser answers with a login prompt
    shows nothing to look at)."""
    found = []
    for entry in session.get_log("performance"):  # type: ignore[no-untyped-call]
        event = json.loads(entry["message"])["message"]
        if event.get("method") == "Network.responseReceived":
            response = event["params"]["response"]
            if response["url"] == url:
                found.append(int(response["status"]))
    return found


def wait_for(session: WebDriver, css: str, *, timeout: float = 10) -> WebElement:
    """The first element matching `css`, once there is one."""
    found: WebElement = WebDriverWait(session, timeout, ignored_exceptions=STALE).until(
        lambda s: (s.find_elements("css selector", css) or [None])[0],
        message=f"no element {css}",
    )
    return found


def wait_text(session: WebDriver, css: str, text: str, *, timeout: float = 10) -> WebElement:
    """The first element matching `css` whose text contains `text`, once there is one."""

    def find(s: WebDriver) -> WebElement | None:
        for element in s.find_elements("css selector", css):
            if text in element.text:
                return element
        return None

    found: WebElement = WebDriverWait(session, timeout, ignored_exceptions=STALE).until(
        find, message=f"no {css} with text {text!r}"
    )
    return found
