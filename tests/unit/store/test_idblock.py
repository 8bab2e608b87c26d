"""DATA_DIR/message-ids: the reserved end of message ids (issue 16 item 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amqpbroker.store.idblock import IdBlockError, read_reserved, write_reserved


def test_no_file_reserves_nothing(tmp_path: Path) -> None:
    assert read_reserved(tmp_path / "message-ids") == 0


def test_written_end_reads_back_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "message-ids"
    write_reserved(path, 65537)
    write_reserved(path, 131073)
    assert read_reserved(path) == 131073
    assert [p.name for p in tmp_path.iterdir()] == ["message-ids"]


HEADER = "amqpbroker message-id reservation v1\n"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "12\n",
        HEADER + "-5\n",
        HEADER + "9" * 5000 + "\n",  # third attack pass: ValueError (int's digit limit)
        HEADER + f"{2**63}\n",  # third attack pass: ids past the journal's i64
    ],
)
def test_a_file_that_says_something_else_is_an_error(tmp_path: Path, text: str) -> None:
    """Never guess where ids start: a wrong guess reuses ids."""
    path = tmp_path / "message-ids"
    path.write_text(text)
    with pytest.raises(IdBlockError, match="not a message-id reservation"):
        read_reserved(path)


@pytest.mark.timeout(20)
def test_a_fifo_or_a_huge_file_in_its_place_is_an_error_not_a_hang(tmp_path: Path) -> None:
    """Fourth attack pass: a FIFO as DATA_DIR/message-ids hung the start on the read
    (waiting for a writer), and a file of gigabytes was read whole before being refused."""
    fifo = tmp_path / "fifo" / "message-ids"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(IdBlockError, match="not a regular file"):
        read_reserved(fifo)
    huge = tmp_path / "huge" / "message-ids"
    huge.parent.mkdir()
    with open(huge, "wb") as f:
        f.truncate(1 << 32)  # sparse: 4 GiB that would be read whole
    with pytest.raises(IdBlockError, match="is not a message-id reservation"):
        read_reserved(huge)
