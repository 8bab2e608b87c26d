"""`amqpbroker check-config` output: the effective settings per address (CONTRACT.md)."""

from __future__ import annotations

import textwrap

import pytest

from amqpbroker.config import default_config_path, format_effective, load_config, parse_config

CONFIG = textwrap.dedent("""\
    acceptors:
      - name: amqp
        url: amqp://127.0.0.1:0
        anycast-prefix: "anycast://"
    http: {bind: "127.0.0.1:0"}
    persistence: {sync: false}
    address-settings:
      "#": {dead-letter-address: DLA, max-delivery-attempts: 5}
      "orders.#": {max-delivery-attempts: 3, redelivery-delay: 100}
      orders.eu: {redelivery-delay: 7}
    addresses:
      - name: orders.eu
        anycast: [{name: orders.eu}]
      - name: news
        multicast: []
    """)


def block(text: str, title: str) -> str:
    """One address or pattern of the effective settings: its title and indented lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {title}:"))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines)
    )
    return "\n".join(lines[start:end]) + "\n"


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        (
            "orders.eu",
            [
                "orders.eu:  # address; queues: orders.eu(ANYCAST)",
                'matched-by: orders.eu, "orders.#", "#"',
                'dead-letter-address: DLA  # "#"',
                'max-delivery-attempts: 3  # "orders.#"',
                "redelivery-delay: 7  # orders.eu",
                "max-redelivery-delay: 70  # redelivery-delay x 10",
                "default-queue-routing-type: MULTICAST\n",
            ],
        ),
        (
            "news",
            [
                "news:  # address; queues: none",
                'matched-by: "#"',
                'max-delivery-attempts: 5  # "#"',
                "redelivery-delay: 0\n",
                'expiry-address: ""\n',
            ],
        ),
        (
            '"orders.#"',
            [
                '"orders.#":  # settings pattern',
                'max-delivery-attempts: 3  # "orders.#"',
                "max-redelivery-delay: 1000  # redelivery-delay x 10",
            ],
        ),
    ],
)
def test_effective_settings_show_value_and_origin(title: str, expected: list[str]) -> None:
    """B-100 overlay and B-103 defaults, per configured address and per pattern."""
    text = format_effective(parse_config(CONFIG, source="c.yaml"))
    section = block(text, title)
    for line in expected:
        assert line in section


def test_broker_level_values_are_listed() -> None:
    text = format_effective(parse_config(CONFIG, source="c.yaml"))
    assert text.startswith("# c.yaml: OK\nname: amqpbroker\n")
    for line in [
        "  - amqp: amqp://127.0.0.1:0 anycast-prefix='anycast://' handshake-timeout=10s"
        " amqp-idle-timeout=60000ms connections-allowed=-1 handshakes-per-source=256",
        "http: 127.0.0.1:0 read-timeout=10000 max-connections=100 sample-interval=5000",
        "persistence: enabled=true sync=false persist-delivery-count-before-delivery=false",
        "message-expiry-scan-period: 30000",
        "max-redelivery-records: 10",
        "event-log: lifecycle",
        "event-log-files: max-file-bytes=67108864 max-file-age=300000 compress=true "
        "max-total-bytes=auto (min 10% of file system, 2 GiB) max-age=604800000 "
        "keep-until-analyzed=false min-free-bytes=auto (min 5% of file system, 1 GiB)",
        "security: disabled",
    ]:
        assert line in text.splitlines()


def test_every_implemented_setting_of_an_address_is_printed() -> None:
    """All B-103 keys amqpbroker implements appear, so nobody has to look defaults up; the
    ones it does not (core/unsupported.py) never show as effective (issue 19)."""
    from amqpbroker.core.settings import SETTING_NAMES
    from amqpbroker.core.unsupported import UNSUPPORTED_SETTINGS

    section = block(format_effective(parse_config(CONFIG)), "news")
    keys = [line.split(":")[0].strip() for line in section.splitlines()[2:]]  # after matched-by
    implemented = [name for name in SETTING_NAMES if name not in UNSUPPORTED_SETTINGS]
    assert keys == [name.replace("_", "-") for name in implemented]
    assert UNSUPPORTED_SETTINGS
    assert not {name.replace("_", "-") for name in UNSUPPORTED_SETTINGS} & set(keys)


def test_default_config_summary() -> None:
    text = format_effective(load_config(default_config_path()))
    assert "  - amqp: amqp://127.0.0.1:5672" in text
    assert 'dead-letter-address: DLA  # "#"' in block(text, "ExpiryQueue")
