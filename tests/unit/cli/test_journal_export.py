"""`amqpbroker journal export --out FILE` where FILE cannot be written (user pass, session
9): one line and exit 1, never a traceback (it was a FileNotFoundError traceback)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from amqpbroker.cli import main
from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AddAddress
from tests.unit.store.test_file_journal import append, open_journal


@pytest.fixture
def stopped_data_dir(tmp_path: Path) -> Path:
    """A stopped broker's data directory whose journal holds one address."""
    journal = open_journal(tmp_path / "data" / "journal")
    append(journal, [AddAddress(name="orders", routing_types=(RoutingType.ANYCAST,))])
    journal.close()
    return tmp_path / "data"


@pytest.mark.parametrize(
    ("out", "reason"),
    [("missing/x.jsonl", errno.ENOENT), (".", errno.EISDIR)],
)
def test_an_out_file_that_cannot_be_written_is_one_line(
    stopped_data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    out: str,
    reason: int,
) -> None:
    target = tmp_path / out
    code = main(["journal", "export", "--data-dir", str(stopped_data_dir), "--out", str(target)])
    assert code == 1
    err = capsys.readouterr().err
    assert err == f"amqpbroker: cannot write {target}: {os.strerror(reason)}\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_under_out_is_one_line(
    stopped_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The export is small: the error shows at the flush, which close() would have raised
    again past the handler."""
    code = main(["journal", "export", "--data-dir", str(stopped_data_dir), "--out", "/dev/full"])
    assert code == 1
    assert capsys.readouterr().err == (
        f"amqpbroker: cannot export the journal: /dev/full: {os.strerror(errno.ENOSPC)}\n"
    )
