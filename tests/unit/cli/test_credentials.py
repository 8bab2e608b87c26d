"""Where the management CLI finds its credentials (issue 15 item 7), without a broker."""

from __future__ import annotations

import base64
import io

import pytest

from amqpbroker.cli import CommandError, Endpoint, _endpoint, build_parser


def endpoint(monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: str = "") -> Endpoint:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return _endpoint(build_parser().parse_args(["queues", *argv]))


def credentials(e: Endpoint) -> str:
    assert e.authorization is not None
    return base64.b64decode(e.authorization.removeprefix("Basic ")).decode()


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMQPBROKER_USER", raising=False)
    monkeypatch.delenv("AMQPBROKER_PASSWORD", raising=False)


def test_credentials_in_the_url_are_percent_decoded_and_left_out_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    e = endpoint(monkeypatch, "--url", "http://ops:p%40ss%3Aw%2Frd%25@127.0.0.1:8161/")
    assert credentials(e) == "ops:p@ss:w/rd%"
    assert str(e) == "http://127.0.0.1:8161"  # the trailing slash is not the API's
    assert "p%40ss" not in repr(e.url)


def test_user_option_with_the_password_from_the_environment_or_stdin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMQPBROKER_PASSWORD", "from-env")
    assert credentials(endpoint(monkeypatch, "--user", "ops")) == "ops:from-env"
    stdin = endpoint(monkeypatch, "--user", "ops", "--password-stdin", stdin="from-stdin\n")
    assert credentials(stdin) == "ops:from-stdin"  # stdin wins over the environment
    monkeypatch.setenv("AMQPBROKER_USER", "env-user")
    assert credentials(endpoint(monkeypatch)) == "env-user:from-env"
    assert credentials(endpoint(monkeypatch, "--user", "ops")) == "ops:from-env"


def test_no_user_means_no_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    e = endpoint(monkeypatch)
    assert (e.user, e.authorization, str(e)) == (None, None, "http://127.0.0.1:8161")


def test_a_user_without_a_password_source_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(CommandError, match="no password for user ops"):
        endpoint(monkeypatch, "--user", "ops")  # stdin is no terminal: no prompt


def test_a_bad_url_is_reported_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CommandError) as info:
        endpoint(monkeypatch, "--url", "ftp://ops:s3cret@host:1")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://h:8161", "http://h:8161"),
        ("http://h:8161/", "http://h:8161"),
        ("http://h:8161/api", "http://h:8161"),
        ("http://h:8161/api/v1/", "http://h:8161"),
        ("https://proxy/broker/", "https://proxy/broker"),  # a mount point is kept
        ("https://proxy/broker/api/v1", "https://proxy/broker"),
    ],
)
def test_url_is_the_base_before_the_api_prefix(
    monkeypatch: pytest.MonkeyPatch, url: str, base: str
) -> None:
    """User pass: the API's own prefix and trailing slashes in --url are left out."""
    assert str(endpoint(monkeypatch, "--url", url)) == base


@pytest.mark.parametrize("url", ["http://h:8161/?a=1", "http://h:8161/#x", "ftp://h", "h:8161"])
def test_url_with_a_query_or_another_scheme_is_refused(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    with pytest.raises(CommandError, match="--url must look like http://HOST:PORT"):
        endpoint(monkeypatch, "--url", url)
