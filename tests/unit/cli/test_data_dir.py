"""`amqpbroker run`'s data directory as a careless operator gives it (user pass, session
9): a file in its place, or a path through a file, is one line that names the directory."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from amqpbroker.cli import lock_data_dir


@pytest.mark.parametrize("where", ["file", "file/below"])
def test_a_file_in_the_way_of_the_data_directory_is_one_clear_line(
    tmp_path: Path, where: str
) -> None:
    """Before: `[Errno 17] File exists: 'DIR'` (which reads as if all were well) or
    `[Errno 20] Not a directory`, neither saying it was the data directory."""
    (tmp_path / "file").write_text("broker.yaml copied here by mistake\n")
    data_dir = tmp_path / where
    with pytest.raises(OSError, match=r"^data directory ") as caught:
        lock_data_dir(data_dir)
    assert str(caught.value) == (
        f"data directory {data_dir}: a file, not a directory, is in the way"
    )


def test_a_data_directory_that_cannot_be_written_names_the_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "broker.lock").mkdir()  # EISDIR from open(), root or not
    with pytest.raises(OSError, match=r"^data directory ") as caught:
        lock_data_dir(data_dir)
    assert str(caught.value) == (
        f"data directory {data_dir}: cannot create {data_dir / 'broker.lock'}: "
        f"{os.strerror(errno.EISDIR)}"
    )
