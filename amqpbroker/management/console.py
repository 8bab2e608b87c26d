"""The operator's web console's files (issue 24): static, shipped in the package.

Only the files listed in `FILES` are served (no path from a request ever reaches the file
system), each with a Content-Security-Policy that lets the page run its own scripts and
talk to its own origin and nothing else: no inline script, no eval, no framing, no
other origin. Everything a message holds is put into the page as text by the scripts
(`textContent`), never as HTML; the policy is the second line of defence.
"""

from __future__ import annotations

import functools
from http import HTTPStatus
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqpbroker.management.api import Reply

FILES = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "overview.js": "text/javascript; charset=utf-8",
    "queue.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# The analyze report is the job's own HTML (inline SVG and styles): shown sandboxed,
# with no script at all.
REPORT_CSP = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:"
REPORT_TYPES = {".html": "text/html; charset=utf-8", ".json": "application/json"}


@functools.cache
def _read(name: str) -> bytes:
    return resources.files("amqpbroker.management").joinpath("console", name).read_bytes()


def console_file(name: str) -> Reply:
    """One of the console's files, or 404."""
    from amqpbroker.management.api import HttpError, Reply

    content_type = FILES.get(name)
    if content_type is None:
        raise HttpError(HTTPStatus.NOT_FOUND, f"no such console file: {name}")
    return Reply(HTTPStatus.OK, _read(name), content_type, PAGE_HEADERS)


def report_file(path: str | None) -> Reply:
    """The configured `http.analyze-report`, read-only; 404 when none is configured."""
    from amqpbroker.management.api import HttpError, Reply

    if path is None:
        raise HttpError(HTTPStatus.NOT_FOUND, "no analyze report is configured")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        message = f"the analyze report cannot be read: {e.strerror}"
        raise HttpError(HTTPStatus.NOT_FOUND, message) from None
    headers = {**PAGE_HEADERS, "Content-Security-Policy": REPORT_CSP}
    return Reply(HTTPStatus.OK, data, REPORT_TYPES[Path(path).suffix], headers)
