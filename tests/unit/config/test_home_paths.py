"""`~` in the config's paths is the user's home, as in a shell (user pass, session 9):
`data-dir: ~/data` made a directory named `~` in the working directory, which a careless
`rm -rf ~` afterwards would not have cleaned up the way its author meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqpbroker.config import parse_config


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_every_path_key_expands_the_home_directory(home: Path) -> None:
    config = parse_config(
        "data-dir: ~/data\n"
        "http: {bind: 127.0.0.1:0, analyze-report: ~/out/report.html}\n"
        "acceptors:\n  - name: s\n    url: amqps://127.0.0.1:0\n"
        "    tls: {cert-file: ~/s.pem, key-file: ~/s.key, ca-file: ~/ca.pem}\n"
    )
    assert config.data_dir == str(home / "data")
    assert config.http.analyze_report == str(home / "out" / "report.html")
    tls = config.acceptors[0].tls
    assert tls is not None
    assert (tls.cert_file, tls.key_file, tls.ca_file) == (
        str(home / "s.pem"),
        str(home / "s.key"),
        str(home / "ca.pem"),
    )


def test_a_tilde_inside_a_path_is_left_alone(home: Path) -> None:
    assert parse_config("data-dir: ./a~b/~c\n").data_dir == "./a~b/~c"
