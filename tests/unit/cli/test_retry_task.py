"""`amqpbroker retry --rate` follows the broker's replay task (issue 24): a progress bar
on a terminal, the task's summary at the end, a one-line error when it does not
complete."""

from __future__ import annotations

import io
from typing import Any

import pytest

from amqpbroker import cli


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def task(done: int, status: str = "running", **more: Any) -> dict[str, Any]:
    return {"id": "t1", "status": status, "done": done, "total": 3, "retried": done, **more}


def test_the_progress_bar_follows_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    polls = iter([task(1), task(3, "completed")])
    monkeypatch.setattr(cli, "_api", lambda url, path, body=None: next(polls))
    monkeypatch.setattr(cli, "TASK_POLL_S", 0)
    err = Tty()
    monkeypatch.setattr("sys.stderr", err)
    final = cli._follow_task(cli.Endpoint("http://x"), task(0))
    assert final["status"] == "completed"
    assert "[" + "#" * 10 + "." * 20 + "] 1/3" in err.getvalue()
    assert err.getvalue().endswith("] 3/3\n")


def test_a_task_that_fails_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = iter([{"task": task(0)}, task(1, "failed", error="queue DLQ.x does not exist")])
    monkeypatch.setattr(cli, "_api", lambda url, path, body=None: next(answers))
    monkeypatch.setattr(cli, "TASK_POLL_S", 0)
    code = cli.main(["retry", "DLQ.x", "--rate", "5", "--url", "http://127.0.0.1:1"])
    assert code == 1
    err = capsys.readouterr().err
    assert "task t1 failed at 1/3: queue DLQ.x does not exist" in err
