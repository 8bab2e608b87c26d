"""An empty QUEUE or --to-queue (user pass, session 9: `amqpbroker purge "$Q"` with Q
unset) is a usage error, exit 2, before any request; it reached the API as
`/queues//purge` and came back as `/api/v1/queues/purge takes GET, HEAD (HTTP 405)`."""

from __future__ import annotations

import pytest

from amqpbroker.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["purge", ""],
        ["messages", ""],
        ["retry", ""],
        ["move", "", "--to-queue", "b"],
        ["move", "a", "--to-queue", ""],
    ],
)
def test_an_empty_queue_name_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # port 9 (discard): were a request made, it would be a different error, not exit 2
    with pytest.raises(SystemExit) as caught:
        main([*argv, "--url", "http://127.0.0.1:9"])
    assert caught.value.code == 2
    assert "a queue name must not be empty" in capsys.readouterr().err
