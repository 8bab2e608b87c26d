"""Every YAML block of the README and docs/ is a config the broker takes as it stands
(user pass, session 9): the README's console permissions were a top-level
`security-settings:`, which the loader refuses (`unknown key`), copied as shown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amqpbroker.config import parse_config
from amqpbroker.security import hash_password

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    return [
        (f"{path.name}#{n}", text)
        for path in DOCS
        for n, text in enumerate(BLOCK.findall(path.read_text()), 1)
    ]


def test_the_readme_has_yaml_blocks() -> None:
    assert sum(name.startswith("README.md#") for name, _ in _blocks()) >= 3


@pytest.mark.parametrize(("name", "text"), _blocks())
def test_a_documented_yaml_block_is_a_valid_config(name: str, text: str) -> None:
    """`scrypt$...` stands for a hash the reader makes with `amqpbroker user hash`."""
    parse_config(text.replace("scrypt$...", hash_password("pw", log2_n=10)), source=name)
