"""What an endpoint answers: a `Reply`, or an `HttpError` to be answered as JSON.

Its own module so that the routing (`api.py`) and the console's files (`console.py`),
which both build replies, do not import each other (issue 18).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

__all__ = ["HttpError", "Reply", "json_reply"]


class HttpError(Exception):
    def __init__(
        self, status: HTTPStatus, message: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


@dataclass(frozen=True, slots=True)
class Reply:
    """One response: what the handler writes (HEAD: all of it but the body)."""

    status: HTTPStatus
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] | None = None


def json_reply(status: HTTPStatus, value: Any, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(value).encode(), headers=headers)
