"""What a request may declare about its body (issue 15: unbounded reads, -1 hung, abc 500)."""

from __future__ import annotations

from http import HTTPStatus

import pytest

from amqpbroker.management.api import HttpError
from amqpbroker.management.http import MAX_BODY_BYTES, declared_length


@pytest.mark.parametrize(
    ("values", "length"),
    [(None, 0), ([], 0), (["0"], 0), (["17"], 17), ([" 17 "], 17), (["5", "5"], 5)],
)
def test_plain_lengths_are_read(values: list[str] | None, length: int) -> None:
    """RFC 9112: no Content-Length (and no Transfer-Encoding) is an empty body."""
    assert declared_length(values, None) == length


@pytest.mark.parametrize(
    ("values", "transfer_encoding", "status"),
    [
        (["-1"], None, HTTPStatus.BAD_REQUEST),
        (["abc"], None, HTTPStatus.BAD_REQUEST),
        (["+5"], None, HTTPStatus.BAD_REQUEST),
        (["5 5"], None, HTTPStatus.BAD_REQUEST),
        (["١٢"], None, HTTPStatus.BAD_REQUEST),  # Arabic-Indic digits: isdigit() but not ASCII
        (["9" * 40], None, HTTPStatus.BAD_REQUEST),
        (["5", "6"], None, HTTPStatus.BAD_REQUEST),  # smuggling: two different lengths
        ([str(MAX_BODY_BYTES + 1)], None, HTTPStatus.REQUEST_ENTITY_TOO_LARGE),
        (["300000000"], None, HTTPStatus.REQUEST_ENTITY_TOO_LARGE),
        (None, "chunked", HTTPStatus.LENGTH_REQUIRED),
        (["5"], "chunked", HTTPStatus.LENGTH_REQUIRED),
    ],
)
def test_lengths_that_lie_or_are_too_big_are_refused(
    values: list[str] | None, transfer_encoding: str | None, status: HTTPStatus
) -> None:
    with pytest.raises(HttpError) as info:
        declared_length(values, transfer_encoding)
    assert info.value.status == status


def test_the_limit_itself_is_allowed() -> None:
    assert declared_length([str(MAX_BODY_BYTES)], None) == MAX_BODY_BYTES
