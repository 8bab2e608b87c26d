"""The "broker NAME started" line (user pass, session 9): what `make run` prints tells a
new user where the data goes and whether a client needs credentials."""

from __future__ import annotations

from pathlib import Path

from amqpbroker.config import parse_config
from amqpbroker.security import hash_password
from amqpbroker.server import started_text


def test_security_off_says_no_credentials_are_needed(tmp_path: Path) -> None:
    text = started_text(parse_config("name: b\n"), tmp_path / "data")
    assert text == (
        f"data directory {tmp_path / 'data'}, security disabled (no credentials: any client "
        "that reaches an acceptor may connect)"
    )


def test_security_on_names_the_mechanisms_and_the_users(tmp_path: Path) -> None:
    hashed = hash_password("pw", log2_n=10)
    config = parse_config(
        "security:\n  enabled: true\n  sasl-mechanisms: [PLAIN]\n"
        f'  users: {{a: {{password-hash: "{hashed}"}}, b: {{password-hash: "{hashed}"}}}}\n'
    )
    text = started_text(config, Path("relative"))
    assert text == (
        f"data directory {Path('relative').resolve()}, security enabled (SASL PLAIN; 2 user(s))"
    )
