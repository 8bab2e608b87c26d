"""Config loading: every problem with file, line and key path (CONTRACT.md, STYLE.md §4)."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from amqpbroker.config import (
    BrokerConfig,
    ConfigError,
    ConfigProblem,
    QueueDef,
    default_config_path,
    load_config,
    parse_config,
)
from amqpbroker.core import ResolvedSettings, RoutingType, SettingsRepository, WildcardConfig
from amqpbroker.core.settings import SETTING_NAMES

REPO = Path(__file__).resolve().parents[3]
HASH = "scrypt$15$8$1$c2FsdHNhbHRzYWx0c2FsdA==$a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2U="


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text), source="b.yaml")
    assert str(info.value) == "\n".join(str(p) for p in info.value.problems)
    return [str(p) for p in info.value.problems]


def parse(text: str) -> BrokerConfig:
    return parse_config(textwrap.dedent(text), source="b.yaml")


def resolved(config: BrokerConfig, address: str) -> ResolvedSettings:
    repo = SettingsRepository(dict(config.address_settings), wildcards=config.wildcard_addresses)
    return repo.resolve(address)


# -- the shipped default ------------------------------------------------------------------


def test_shipped_config_is_the_embedded_default() -> None:
    """`make run` uses config/broker.yaml; the package ships the same file."""
    assert (REPO / "config" / "broker.yaml").read_bytes() == default_config_path().read_bytes()


def test_embedded_default_sets_a_dla_and_expiry_address() -> None:
    """B-046: `rejected` drops the message when there is no DLA, so the default sets one,
    with its queue, as Artemis ships."""
    config = load_config(default_config_path())
    settings = resolved(config, "orders")
    assert (settings.dead_letter_address, settings.expiry_address) == ("DLA", "ExpiryQueue")
    assert settings.auto_create_dead_letter_resources
    assert settings.auto_create_expiry_resources
    assert (settings.max_delivery_attempts, settings.redelivery_delay) == (10, 0)
    assert settings.default_address_routing_type is RoutingType.MULTICAST
    assert settings.default_queue_routing_type is RoutingType.MULTICAST
    assert [(a.name, [q.name for q in a.anycast]) for a in config.addresses] == [
        ("DLA", ["DLA"]),
        ("ExpiryQueue", ["ExpiryQueue"]),
    ]


def test_embedded_default_listens_on_loopback() -> None:
    config = load_config(default_config_path())
    assert [(a.name, a.url, a.host, a.port) for a in config.acceptors] == [
        ("amqp", "amqp://127.0.0.1:5672", "127.0.0.1", 5672)
    ]
    assert (config.http.enabled, config.http.host, config.http.port) == (True, "127.0.0.1", 8161)
    assert config.persistence.enabled
    assert config.persistence.sync
    assert config.event_log.enabled
    assert config.event_log.level == "lifecycle"
    assert config.name == "amqpbroker"


def test_empty_file_means_all_defaults() -> None:
    """B-103/B-104 defaults; one loopback acceptor named amqp."""
    config = parse_config("# nothing here\n")
    assert config == BrokerConfig(source="<string>")
    assert [(a.name, a.url) for a in config.acceptors] == [("amqp", "amqp://127.0.0.1:5672")]
    assert (config.message_expiry_scan_period, config.address_queue_scan_period) == (30000, 30000)
    assert (config.max_redelivery_records, config.id_cache_size) == (10, 20000)
    assert config.address_settings == {}
    assert config.wildcard_addresses == WildcardConfig()


def test_config_objects_are_frozen() -> None:
    config = parse_config("")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "x"  # type: ignore[misc]


# -- every kind of problem ----------------------------------------------------------------

ERRORS = [
    # unknown keys, with a hint when one is close
    (
        "acceptors:\n  - name: a\n    url: amqp://127.0.0.1:0\n    tsl: {}\n",
        "b.yaml:4: acceptors[0].tsl: unknown key (did you mean 'tls'?)",
    ),
    ("bogus: 1\n", "b.yaml:1: bogus: unknown key"),
    (
        "address-settings:\n  '#':\n    dead-letter-adress: DLA\n",
        'b.yaml:3: address-settings."#".dead-letter-adress: unknown key '
        "(did you mean 'dead-letter-address'?)",
    ),
    (
        "security:\n  security-settings:\n    'orders.#': {sned: [app]}\n",
        'b.yaml:3: security.security-settings."orders.#".sned: unknown key '
        "(did you mean 'send'?)",
    ),
    ("name: a\nname: b\n", "b.yaml:2: name: duplicate key"),
    ("address-settings:\n  '#': {}\n  '#': {}\n", 'b.yaml:3: address-settings."#": duplicate key'),
    # wrong types: bool is not an int, YAML 1.1 'yes' is not a boolean
    (
        "address-settings:\n  'orders.#':\n    max-delivery-attempts: ten\n",
        "b.yaml:3: address-settings.\"orders.#\".max-delivery-attempts: not an integer: 'ten'",
    ),
    (
        "address-settings:\n  '#':\n    max-delivery-attempts: true\n",
        'b.yaml:3: address-settings."#".max-delivery-attempts: not an integer: True',
    ),
    (
        "address-settings:\n  '#':\n    redelivery-delay: 1.5\n",
        'b.yaml:3: address-settings."#".redelivery-delay: not an integer: 1.5',
    ),
    (
        "address-settings:\n  '#':\n    auto-create-queues: 1\n",
        'b.yaml:3: address-settings."#".auto-create-queues: not a boolean: 1',
    ),
    (
        "address-settings:\n  '#':\n    dead-letter-address: [DLA]\n",
        'b.yaml:3: address-settings."#".dead-letter-address: expected a string, not a list',
    ),
    ("persistence:\n  sync: maybe\n", "b.yaml:2: persistence.sync: not a boolean: 'maybe'"),
    (
        "persistence:\n  sync: yes\n",
        "b.yaml:2: persistence.sync: not a boolean: 'yes' "
        "(write true or false: YAML 1.2 reads yes/no/on/off as text)",
    ),
    ("persistence: true\n", "b.yaml:1: persistence: expected a mapping"),
    ("acceptors: {name: a}\n", "b.yaml:1: acceptors: expected a list"),
    ("name: null\n", "b.yaml:1: name: expected a string, not null"),
    ("name: ''\n", "b.yaml:1: name: must not be empty"),
    (
        "event-log:\n  properties: tenant\n",
        "b.yaml:2: event-log.properties: expected a list of strings",
    ),
    ("event-log:\n  properties: [a, 1]\n", "b.yaml:2: event-log.properties[1]: not a string: 1"),
    # bad enum values
    (
        "address-settings:\n  '#':\n    default-address-routing-type: BOTH\n",
        'b.yaml:3: address-settings."#".default-address-routing-type: '
        "must be one of ANYCAST, MULTICAST: 'BOTH'",
    ),
    (
        "address-settings:\n  '#':\n    default-queue-routing-type: anycast\n",
        'b.yaml:3: address-settings."#".default-queue-routing-type: '
        "must be one of ANYCAST, MULTICAST: 'anycast'",
    ),
    (
        "address-settings:\n  '#':\n    address-full-policy: SPILL\n",
        'b.yaml:3: address-settings."#".address-full-policy: '
        "must be one of PAGE, BLOCK, FAIL, DROP: 'SPILL'",
    ),
    (
        "address-settings:\n  '#':\n    config-delete-queues: NEVER\n",
        "b.yaml:3: address-settings.\"#\".config-delete-queues: must be one of OFF, FORCE: 'NEVER'",
    ),
    (
        "event-log:\n  body-hash: sha1\n",
        "b.yaml:2: event-log.body-hash: must be true, false or keyed: 'sha1'",
    ),
    (
        "event-log:\n  body-hash: [x]\n",
        "b.yaml:2: event-log.body-hash: must be true, false or keyed: None",
    ),
    (
        "event-log:\n  level: verbose\n",
        "b.yaml:2: event-log.level: must be one of off, failures, lifecycle: 'verbose'",
    ),
    (
        "acceptors:\n  - name: s\n    url: amqps://0.0.0.0:5671\n"
        "    tls: {cert-file: c.pem, key-file: k.pem, client-auth: maybe}\n",
        "b.yaml:4: acceptors[0].tls.client-auth: must be one of none, optional, required: 'maybe'",
    ),
    (
        "security:\n  sasl-mechanisms: [PLAIN, CRAM-MD5]\n",
        "b.yaml:2: security.sasl-mechanisms[1]: must be one of PLAIN, EXTERNAL, ANONYMOUS: "
        "'CRAM-MD5'",
    ),
    # out-of-range values (B-067 and friends)
    (
        "address-settings:\n  '#':\n    redelivery-collision-avoidance-factor: 1.5\n",
        'b.yaml:3: address-settings."#".redelivery-collision-avoidance-factor: '
        "must be between 0 and 1: 1.5",
    ),
    (
        "address-settings:\n  '#':\n    redelivery-collision-avoidance-factor: -0.1\n",
        'b.yaml:3: address-settings."#".redelivery-collision-avoidance-factor: '
        "must be between 0 and 1: -0.1",
    ),
    (
        "address-settings:\n  '#':\n    redelivery-collision-avoidance-factor: .nan\n",
        'b.yaml:3: address-settings."#".redelivery-collision-avoidance-factor: '
        "not a finite number: nan",
    ),
    (
        "address-settings:\n  '#':\n    redelivery-delay: -5\n",
        'b.yaml:3: address-settings."#".redelivery-delay: must be >= 0: -5',
    ),
    (
        "address-settings:\n  '#':\n    max-redelivery-delay: -1\n",
        'b.yaml:3: address-settings."#".max-redelivery-delay: must be >= 0: -1',
    ),
    (
        "address-settings:\n  '#':\n    redelivery-delay-multiplier: 0.5\n",
        'b.yaml:3: address-settings."#".redelivery-delay-multiplier: must be >= 1.0: 0.5',
    ),
    (
        "message-expiry-scan-period: -2\n",
        "b.yaml:1: message-expiry-scan-period: must be -1 (off) or >= 0: -2",
    ),
    ("id-cache-size: -1\n", "b.yaml:1: id-cache-size: must be >= 0: -1"),
    ("event-log: {max-file-bytes: 0}\n", "b.yaml:1: event-log.max-file-bytes: must be >= 1: 0"),
    (  # issue 17: the disk budget
        "event-log:\n  max-total-bytes: 0\n",
        "b.yaml:2: event-log.max-total-bytes: must be -1 (off) or >= 1: 0",
    ),
    (
        "event-log:\n  max-file-bytes: 1000\n  max-total-bytes: 999\n",
        "b.yaml:3: event-log.max-total-bytes: must be -1 (off) or >= max-file-bytes (1000): 999",
    ),
    (
        "event-log:\n  max-age: -7\n",
        "b.yaml:2: event-log.max-age: must be -1 (off) or >= 1: -7",
    ),
    (
        "event-log:\n  min-free-bytes: -1\n",
        "b.yaml:2: event-log.min-free-bytes: must be >= 0: -1",
    ),
    ("event-log:\n  compress: gzip\n", "b.yaml:2: event-log.compress: not a boolean: 'gzip'"),
    (
        "event-log:\n  keep-until-analyzed: 1\n",
        "b.yaml:2: event-log.keep-until-analyzed: not a boolean: 1",
    ),
    (
        "addresses:\n  - name: a\n    anycast:\n      - {name: a, max-consumers: -2}\n",
        "b.yaml:4: addresses[0].anycast[0].max-consumers: must be -1 (unlimited) or >= 0: -2",
    ),
    (
        "addresses:\n  - name: a\n    anycast:\n      - {name: a, ring-size: -5}\n",
        "b.yaml:4: addresses[0].anycast[0].ring-size: must be -1 (off) or >= 0: -5",
    ),
    # ports, URLs and schemes
    (
        "acceptors:\n  - name: a\n    url: amqp://127.0.0.1:99999\n",
        "b.yaml:3: acceptors[0].url: expected amqp://HOST:PORT or amqps://HOST:PORT "
        "(port 0-65535): 'amqp://127.0.0.1:99999'",
    ),
    (
        "acceptors:\n  - name: a\n    url: amqp://127.0.0.1:-1\n",
        "b.yaml:3: acceptors[0].url: expected amqp://HOST:PORT or amqps://HOST:PORT "
        "(port 0-65535): 'amqp://127.0.0.1:-1'",
    ),
    (
        "acceptors:\n  - name: a\n    url: amqp://127.0.0.1\n",
        "b.yaml:3: acceptors[0].url: expected amqp://HOST:PORT or amqps://HOST:PORT "
        "(port 0-65535): 'amqp://127.0.0.1'",
    ),
    (
        "acceptors:\n  - name: a\n    url: http://x:1\n",
        "b.yaml:3: acceptors[0].url: expected amqp://HOST:PORT or amqps://HOST:PORT "
        "(port 0-65535): 'http://x:1'",
    ),
    (
        "acceptors:\n  - name: a\n    url: tcp://0.0.0.0:5672?protocols=AMQP\n",
        "b.yaml:3: acceptors[0].url: expected amqp://HOST:PORT or amqps://HOST:PORT "
        "(port 0-65535): 'tcp://0.0.0.0:5672?protocols=AMQP'",
    ),
    (
        "acceptors:\n  - name: a\n    url: amqp://0.0.0.0:5672?amqpCredits=1000\n",
        "b.yaml:3: acceptors[0].url: only amqp[s]://HOST:PORT is read; acceptor options are "
        "keys of the acceptor: 'amqp://0.0.0.0:5672?amqpCredits=1000'",
    ),
    (
        "acceptors:\n  - name: s\n    url: amqps://0.0.0.0:5671\n",
        "b.yaml:3: acceptors[0].url: an amqps:// acceptor needs a tls: section",
    ),
    (
        "acceptors:\n  - name: a\n    url: amqp://0.0.0.0:5672\n"
        "    tls: {cert-file: c.pem, key-file: k.pem}\n",
        "b.yaml:4: acceptors[0].tls: tls: is read only for amqps:// acceptors",
    ),
    (
        "acceptors:\n  - name: s\n    url: amqps://0.0.0.0:5671\n    tls: {cert-file: c.pem}\n",
        "b.yaml:4: acceptors[0].tls.key-file: required key is missing",
    ),
    (
        "http:\n  bind: localhost\n",
        "b.yaml:2: http.bind: expected HOST:PORT (port 0-65535): 'localhost'",
    ),
    (
        "http:\n  bind: 127.0.0.1:70000\n",
        "b.yaml:2: http.bind: expected HOST:PORT (port 0-65535): '127.0.0.1:70000'",
    ),
    # issue 15: HTTP read timeout and connection cap
    (
        "http:\n  read-timeout: 0\n",
        "b.yaml:2: http.read-timeout: must be between 100 and 600000: 0",
    ),
    (
        "http:\n  max-connections: 0\n",
        "b.yaml:2: http.max-connections: must be between 1 and 10000: 0",
    ),
    # issue 24: the console's samples and the analyze report link
    (
        "http:\n  sample-interval: 50\n",
        "b.yaml:2: http.sample-interval: must be between 100 and 60000: 50",
    ),
    (
        "http:\n  analyze-report: /etc/passwd\n",
        "b.yaml:2: http.analyze-report: must name an analyze report (.html or .json): "
        "'/etc/passwd'",
    ),
    (
        "http:\n  analyze-report: 5\n",
        "b.yaml:2: http.analyze-report: not a string: 5",
    ),
    # B-101: '#' only as the last word of a pattern
    (
        "address-settings:\n  'a.#.b': {}\n",
        "b.yaml:2: address-settings.\"a.#.b\": '#' is allowed only as the last word of a pattern",
    ),
    (
        "address-settings:\n  'orders#': {}\n",
        "b.yaml:2: address-settings.\"orders#\": '#' is allowed only as the last word of a pattern",
    ),
    (
        "security:\n  security-settings:\n    '#.x': {send: [a]}\n",
        "b.yaml:3: security.security-settings.\"#.x\": '#' is allowed only as the last word of "
        "a pattern",
    ),
    # An empty word in a pattern (h-loose): a typo Artemis takes silently
    (
        "address-settings:\n  'orders..#': {}\n",
        "b.yaml:2: address-settings.\"orders..#\": an empty word (two '.' together): did you "
        "mean 'orders.#'?",
    ),
    (
        "security:\n  security-settings:\n    'orders.': {send: [a]}\n",
        "b.yaml:3: security.security-settings.\"orders.\": an empty word (a trailing '.'): did "
        "you mean 'orders'?",
    ),
    (
        "address-settings:\n  '.orders': {}\n",
        "b.yaml:2: address-settings.\".orders\": an empty word (a leading '.'): did you mean "
        "'orders'?",
    ),
    # B-150 names
    ("addresses:\n  - name: ''\n", "b.yaml:2: addresses[0].name: address name must not be empty"),
    (
        'addresses:\n  - name: "a\\u0001b"\n',
        "b.yaml:2: addresses[0].name: address name 'a\\x01b' contains a control character",
    ),
    (  # issue 15 attack: no UTF-8 encoder takes it (journal, metrics labels)
        'addresses:\n  - name: "a\\udc80"\n',
        "b.yaml:2: addresses[0].name: address name 'a\\udc80' is not Unicode text (a lone "
        "surrogate)",
    ),
    (
        "addresses:\n  - name: 'a::b::c'\n",
        "b.yaml:2: addresses[0].name: address name 'a::b::c' has more than one '::'",
    ),
    (
        "addresses:\n  - name: a\n    anycast:\n      - name: ''\n",
        "b.yaml:4: addresses[0].anycast[0].name: queue name must not be empty",
    ),
    (
        'addresses:\n  - name: a\n    multicast:\n      - name: "q\\tx"\n',
        "b.yaml:4: addresses[0].multicast[0].name: queue name 'q\\tx' contains a control character",
    ),
    (
        "address-settings:\n  '#':\n    dead-letter-address: 'x::y::z'\n",
        "b.yaml:3: address-settings.\"#\".dead-letter-address: address name 'x::y::z' has more "
        "than one '::'",
    ),
    (
        "address-settings:\n  '': {}\n",
        'b.yaml:2: address-settings."": match name must not be empty',
    ),
    (
        "acceptors:\n  - name: http\n    url: amqp://127.0.0.1:0\n",
        "b.yaml:2: acceptors[0].name: acceptor name 'http' is reserved (ports.json uses it for "
        "HTTP)",
    ),
    # required keys and duplicates
    (
        "acceptors:\n  - url: amqp://127.0.0.1:1\n",
        "b.yaml:2: acceptors[0].name: required key is missing",
    ),
    ("addresses:\n  - anycast: []\n", "b.yaml:2: addresses[0].name: required key is missing"),
    (
        "acceptors:\n  - {name: a, url: 'amqp://127.0.0.1:0'}\n"
        "  - {name: a, url: 'amqp://127.0.0.1:0'}\n",
        "b.yaml:3: acceptors[1].name: duplicate acceptor name (also at line 2)",
    ),
    (
        "addresses:\n  - name: a\n  - name: a\n",
        "b.yaml:3: addresses[1].name: duplicate address name (also at line 2)",
    ),
    (  # B-160: the management address is answered by the broker, never a real address
        "addresses:\n  - {name: activemq.management, anycast: [{name: q}]}\n",
        "b.yaml:2: addresses[0].name: activemq.management is the management address: it "
        "cannot be configured",
    ),
    (
        "addresses:\n  - {name: a, anycast: [{name: q}]}\n  - {name: b, multicast: [{name: q}]}\n",
        "b.yaml:3: addresses[1].multicast[0].name: queue name 'q' is used more than once "
        "(also at line 2); queue names are unique across the broker",
    ),
    # filters, security values, wildcard config, merge keys
    (
        "addresses:\n  - name: q\n    anycast:\n      - name: q\n        filter: 'a ='\n",
        "b.yaml:5: addresses[0].anycast[0].filter: invalid filter: expected a value, an "
        "identifier or '(' at position 3, found end of selector",
    ),
    (
        "security:\n  users:\n    bob: {password-hash: secret}\n",
        "b.yaml:3: security.users.bob.password-hash: not a password hash "
        "(make one with `amqpbroker user hash`)",
    ),
    (
        "security:\n  users:\n    bob: {roles: [a]}\n",
        "b.yaml:3: security.users.bob.password-hash: required key is missing",
    ),
    (
        "security:\n  enabled: true\n  sasl-mechanisms: []\n",
        "b.yaml:3: security.sasl-mechanisms: must not be empty when security is enabled "
        "(no client could connect)",
    ),
    (
        "wildcard-addresses:\n  single-word: '#'\n",
        "b.yaml:2: wildcard-addresses: delimiter, any-words and single-word must all differ",
    ),
    (
        "wildcard-addresses:\n  delimiter: ''\n",
        "b.yaml:2: wildcard-addresses.delimiter: must not be empty",
    ),
    (
        "persistence:\n  <<: 1\n",
        'b.yaml:2: persistence."<<": merges only mappings, not recursively',
    ),
    # the file itself
    ("[1, 2]\n", "b.yaml:1: (top level): expected a mapping"),
    ("just text\n", "b.yaml:1: (top level): expected a mapping"),
    ("a: b: c\n", "b.yaml:1: (yaml): not valid YAML: mapping values are not allowed here"),
    (
        "name: x\nacceptors:\n\t- name: a\n",
        "b.yaml:3: (yaml): not valid YAML: found character '\\t' that cannot start any token "
        "(while scanning for the next token): indent with spaces, YAML does not take tabs there",
    ),
    (
        "---\na: 1\n---\nb: 2\n",
        "b.yaml:3: (yaml): not valid YAML: but found another document "
        "(expected a single document in the stream)",
    ),
    (
        "name: 'x\n",
        "b.yaml:2: (yaml): not valid YAML: found unexpected end of stream "
        "(while scanning a quoted scalar)",
    ),
]


@pytest.mark.parametrize(("text", "expected"), ERRORS)
def test_each_problem_names_file_line_and_key(text: str, expected: str) -> None:
    """Unknown keys, wrong types, bad values, names (B-150), patterns (B-101), ranges
    (B-067) and duplicate queues (B-001): `file:line: key.path: message`, nothing else."""
    assert problems(text) == [expected]


def test_all_problems_are_reported_together_in_file_order() -> None:
    """One ConfigError lists every problem, not just the first."""
    found = problems("""\
        nmae: x
        acceptors:
          - name: a
            url: amqp://127.0.0.1:0
            tsl: {}
        address-settings:
          '#': {max-delivery-attempts: ten, dead-letter-adress: DLA}
        addresses:
          - {name: a, anycast: [{name: q}]}
          - {name: b, anycast: [{name: q}]}
        wildcard-addresses: {delimiter: ''}
        """)
    assert found == [
        "b.yaml:1: nmae: unknown key (did you mean 'name'?)",
        "b.yaml:5: acceptors[0].tsl: unknown key (did you mean 'tls'?)",
        "b.yaml:7: address-settings.\"#\".max-delivery-attempts: not an integer: 'ten'",
        'b.yaml:7: address-settings."#".dead-letter-adress: unknown key '
        "(did you mean 'dead-letter-address'?)",
        "b.yaml:10: addresses[1].anycast[0].name: queue name 'q' is used more than once "
        "(also at line 9); queue names are unique across the broker",
        "b.yaml:11: wildcard-addresses.delimiter: must not be empty",
    ]


def test_config_error_keeps_the_problems_as_values() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("persistence: {sync: maybe}\n", source="config/broker.yaml")
    assert info.value.problems == [
        ConfigProblem("config/broker.yaml", 1, "persistence.sync", "not a boolean: 'maybe'")
    ]
    assert str(info.value) == "config/broker.yaml:1: persistence.sync: not a boolean: 'maybe'"


# -- what is accepted ---------------------------------------------------------------------


@pytest.mark.parametrize("field", SETTING_NAMES)
def test_every_address_setting_is_accepted_by_its_kebab_name(field: str) -> None:
    """CONTRACT: every B-103 setting is accepted under its kebab-case name."""
    value = getattr(ResolvedSettings(), field)
    value = value.value if isinstance(value, RoutingType) else value
    text = yaml.safe_dump({"address-settings": {"#": {field.replace("_", "-"): value}}})
    config = parse_config(text)
    expected = getattr(ResolvedSettings(), field)
    assert config.address_settings["#"].as_dict() == {field: expected}


def test_event_log_disk_budget_keys_and_their_defaults() -> None:
    """Issue 17: retention and the free-space floor; unset (or null) sizes are worked out
    from the file system by the writer process."""
    default = parse_config("").event_log
    assert (default.compress, default.keep_until_analyzed) == (True, False)
    assert (default.max_total_bytes, default.min_free_bytes) == (None, None)
    assert default.max_age == 7 * 86_400_000
    config = parse_config(
        "event-log:\n  compress: false\n  max-file-bytes: 1000\n  max-total-bytes: 1000\n"
        "  max-age: -1\n"
        "  keep-until-analyzed: true\n  min-free-bytes: 0\n"
    ).event_log
    assert (config.compress, config.max_total_bytes, config.max_age) == (False, 1000, -1)
    assert (config.keep_until_analyzed, config.min_free_bytes) == (True, 0)
    assert parse_config("event-log: {max-total-bytes: null}").event_log.max_total_bytes is None


def test_body_hash_is_keyed_by_default_and_takes_true_false_keyed() -> None:
    """Issue 22 item 3: payload identity for poison detection by default, as a keyed hash
    (no dictionary attack on the content); `true` is the plain SHA-256 of B-170."""
    assert parse_config("").event_log.body_hash == "keyed"
    for value, expected in (("true", True), ("false", False), ("keyed", "keyed")):
        assert parse_config(f"event-log: {{body-hash: {value}}}").event_log.body_hash == expected


def test_all_address_settings_at_once_resolve_to_the_defaults() -> None:
    """B-103: the defaults written out in full resolve to the built-in defaults."""
    text = yaml.safe_dump({"address-settings": {"#": ResolvedSettings().to_config()}})
    assert resolved(parse_config(text), "anything") == ResolvedSettings()


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        # YAML 1.2 scalars: these stay strings (PyYAML's YAML 1.1 would read booleans/dates)
        ("event-log: {level: off}", "level", "off"),
        ("name: 2024-01-01", "name", "2024-01-01"),
        ("name: NO", "name", "NO"),
        ("name: 010", "name", "010"),  # not octal 8, not decimal 10
        # an int where a number is expected
        ("address-settings: {'#': {redelivery-delay-multiplier: 2}}", "multiplier", 2.0),
        ("address-settings: {'#': {redelivery-collision-avoidance-factor: 1}}", "factor", 1.0),
        ("address-settings: {'#': {config-delete-queues: OFF}}", "config_delete_queues", "OFF"),
        ("id-cache-size: 1_000", "id_cache_size", 1000),
        ("id-cache-size: 0x10", "id_cache_size", 16),
    ],
)
def test_scalars_follow_the_yaml_core_schema(text: str, field: str, expected: object) -> None:
    config = parse_config(text)
    settings = resolved(config, "x")
    values = {
        "level": config.event_log.level,
        "name": config.name,
        "multiplier": settings.redelivery_delay_multiplier,
        "factor": settings.redelivery_collision_avoidance_factor,
        "config_delete_queues": settings.config_delete_queues,
        "id_cache_size": config.id_cache_size,
    }
    assert values[field] == expected
    assert type(values[field]) is type(expected)


def test_null_max_redelivery_delay_means_ten_times_the_delay() -> None:
    """B-066: `max-redelivery-delay: null` is unset, so it is redelivery-delay x 10."""
    config = parse("""\
        address-settings:
          "#": {redelivery-delay: 100, max-redelivery-delay: null}
        """)
    assert config.address_settings["#"].as_dict() == {"redelivery_delay": 100}
    assert resolved(config, "orders").max_redelivery_delay == 1000


def test_null_inherits_from_a_broader_match() -> None:
    """B-100: null is "not set here", so the broader pattern's value shows through."""
    config = parse("""\
        address-settings:
          "#": {max-redelivery-delay: 5000, dead-letter-address: DLA}
          orders: {max-redelivery-delay: null, dead-letter-address: null}
        """)
    settings = resolved(config, "orders")
    assert (settings.max_redelivery_delay, settings.dead_letter_address) == (5000, "DLA")


def test_overlay_of_three_patterns() -> None:
    """B-100: '#', 'orders.#', 'orders.eu' overlay field by field, most specific first."""
    config = parse("""\
        address-settings:
          "#": {dead-letter-address: DLA, max-delivery-attempts: 5, redelivery-delay: 1}
          "orders.#": {max-delivery-attempts: 3, redelivery-delay: 100}
          orders.eu: {redelivery-delay: 7, default-queue-routing-type: ANYCAST}
        """)
    assert list(config.address_settings) == ["#", "orders.#", "orders.eu"]
    eu = resolved(config, "orders.eu")
    assert (eu.dead_letter_address, eu.max_delivery_attempts, eu.redelivery_delay) == ("DLA", 3, 7)
    assert eu.default_queue_routing_type is RoutingType.ANYCAST
    assert eu.max_redelivery_delay == 70
    us = resolved(config, "orders.us")
    assert (us.max_delivery_attempts, us.redelivery_delay) == (3, 100)
    assert us.default_queue_routing_type is RoutingType.MULTICAST
    other = resolved(config, "payments")
    assert (other.max_delivery_attempts, other.redelivery_delay) == (5, 1)


def test_merge_keys_share_settings_and_own_keys_win() -> None:
    config = parse("""\
        address-settings:
          "#": &base {max-delivery-attempts: 3, redelivery-delay: 5}
          orders:
            <<: *base
            redelivery-delay: 7
        """)
    assert config.address_settings["orders"].as_dict() == {
        "max_delivery_attempts": 3,
        "redelivery_delay": 7,
    }


def test_custom_wildcards_decide_which_patterns_are_valid() -> None:
    """B-101 is judged with the configured any-words word, not the default '#'."""
    config = parse("""\
        address-settings:
          "orders.>": {max-delivery-attempts: 2}
          "a.#.b": {max-delivery-attempts: 4}
        wildcard-addresses: {any-words: ">"}
        """)
    assert config.wildcard_addresses.any_words == ">"
    assert resolved(config, "orders.eu.x").max_delivery_attempts == 2
    assert resolved(config, "a.#.b").max_delivery_attempts == 4  # '#' is a literal word here


def test_acceptors_are_parsed_from_their_urls() -> None:
    config = parse("""\
        acceptors:
          - name: amqp
            url: amqp://0.0.0.0:0
            anycast-prefix: "anycast://"
            multicast-prefix: "multicast://"
          - name: amqps
            url: "amqps://[::1]:5671"
            tls: {cert-file: s.pem, key-file: s.key, ca-file: ca.pem, client-auth: required}
            amqp-treat-reject-as-unmodified-delivery-failed: true
            amqp-duplicate-detection: false
        """)
    plain, secure = config.acceptors
    assert (plain.scheme, plain.host, plain.port, plain.tls) == ("amqp", "0.0.0.0", 0, None)
    assert (plain.anycast_prefix, plain.multicast_prefix) == ("anycast://", "multicast://")
    assert (secure.scheme, secure.host, secure.port) == ("amqps", "::1", 5671)
    assert secure.tls is not None
    assert secure.tls.client_auth == "required"
    assert secure.amqp_treat_reject_as_unmodified_delivery_failed
    assert not secure.amqp_duplicate_detection


def test_addresses_keep_their_routing_types_and_queues() -> None:
    config = parse("""\
        addresses:
          - name: orders
            anycast:
              - {name: orders, durable: false, max-consumers: 2, filter: "priority > 4"}
          - name: news
            multicast: []
          - name: both
            anycast:
            multicast:
              - {name: both.audit, durable: true, max-consumers: 1}
        """)
    orders, news, both = config.addresses
    assert orders.anycast == (
        QueueDef(name="orders", durable=False, max_consumers=2, filter="priority > 4"),
    )
    assert news.routing_types == frozenset({"MULTICAST"})
    assert news.multicast == ()
    assert both.routing_types == frozenset({"ANYCAST", "MULTICAST"})
    assert both.multicast == (QueueDef(name="both.audit", max_consumers=1),)


def test_security_section() -> None:
    """B-154: users with scrypt hashes, permissions by pattern with Artemis names."""
    config = parse(f"""\
        security:
          enabled: true
          sasl-mechanisms: [PLAIN]
          users:
            admin: {{password-hash: "{HASH}", roles: [admin]}}
          security-settings:
            "#": {{send: [admin], create-durable-queue: [admin], manage: [admin]}}
        """)
    security = config.security
    assert security.enabled
    assert security.sasl_mechanisms == ("PLAIN",)
    assert security.users["admin"].roles == ("admin",)
    assert security.security_settings == {
        "#": {"send": ("admin",), "create-durable-queue": ("admin",), "manage": ("admin",)}
    }


def test_http_bind_and_switch_off() -> None:
    assert parse("http: {bind: '[::1]:0'}").http.host == "::1"
    assert not parse("http: {enabled: false}").http.enabled


def test_http_read_timeout_and_max_connections() -> None:
    """Issue 15 (slowloris): both keys reach HttpConfig, in ms and connections."""
    http = parse("http: {read-timeout: 2500, max-connections: 8}").http
    assert (http.read_timeout, http.max_connections) == (2500, 8)
    assert (parse("name: x").http.read_timeout, parse("name: x").http.max_connections) == (
        10_000,
        100,
    )


# -- files --------------------------------------------------------------------------------


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("name: a\naddress-settings:\n  '#': {max-delivery-attempts: ten}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}:3: address-settings.\"#\".max-delivery-attempts: not an integer: 'ten'"
    )


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_bytes(b"name: a\nname2: \xff\n")
    with pytest.raises(ConfigError, match=r"broker\.yaml:2: \(file\): not UTF-8 text"):
        load_config(path)


def test_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No such file"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "names"),
    [("acceptors:\n", ["amqp"]), ("acceptors: []\n", []), ("", ["amqp"])],
)
def test_null_acceptors_keep_the_default_an_empty_list_means_none(
    text: str, names: list[str]
) -> None:
    """`null` is "not set" everywhere, so `acceptors:` alone keeps the default acceptor."""
    assert [a.name for a in parse_config(text).acceptors] == names


def test_acceptor_max_message_size_defaults_to_unlimited_and_is_range_checked() -> None:
    """B-152 / issue 16 item 3: bytes per message on that acceptor; 0 is no limit."""
    config = parse("""\
        acceptors:
          - {name: limited, url: "amqp://127.0.0.1:0", max-message-size: 10000}
          - {name: open, url: "amqp://127.0.0.1:0"}
        """)
    assert [a.max_message_size for a in config.acceptors] == [10_000, 0]
    assert problems("""\
        acceptors:
          - {name: a, url: "amqp://127.0.0.1:0", max-message-size: -1}
          - {name: b, url: "amqp://127.0.0.1:0", max-message-size: 18446744073709551616}
          - {name: c, url: "amqp://127.0.0.1:0", max-message-size: 1 MB}
        """) == [
        "b.yaml:2: acceptors[0].max-message-size: must be 0 (no limit) or a size in bytes "
        "below 2^64: -1",
        "b.yaml:3: acceptors[1].max-message-size: must be 0 (no limit) or a size in bytes "
        "below 2^64: 18446744073709551616",
        "b.yaml:4: acceptors[2].max-message-size: not an integer: '1 MB'",
    ]


def test_connection_limits_of_an_acceptor_and_their_defaults() -> None:
    """Issue 15 item 8: Artemis defaults (handshake-timeout 10 s, amqpIdleTimeout 60000 ms
    = connection-ttl, connectionsAllowed -1) unless set."""
    config = parse("""\
        acceptors:
          - {name: a, url: "amqp://127.0.0.1:0"}
          - name: b
            url: amqp://127.0.0.1:0
            handshake-timeout: 0
            amqp-idle-timeout: 2000
            connections-allowed: 500
            handshakes-per-source: -1
        """)
    a, b = config.acceptors
    assert (a.handshake_timeout, a.amqp_idle_timeout, a.connections_allowed) == (10, 60_000, -1)
    assert (b.handshake_timeout, b.amqp_idle_timeout, b.connections_allowed) == (0, 2000, 500)
    # fourth attack pass: sockets of one source before the open, 256 unless set
    assert (a.handshakes_per_source, b.handshakes_per_source) == (256, -1)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("handshake-timeout", "-2", "must be between -1 and 86400: -2"),
        ("handshake-timeout", "ten", "not an integer: 'ten'"),
        ("amqp-idle-timeout", "4294967296", "must be -1, 0 (off) or 1..4294967295: 4294967296"),
        ("connections-allowed", "0", "must be -1 (off) or >= 1: 0"),
        ("connections-allowed", "1.5", "not an integer: 1.5"),
        ("handshakes-per-source", "0", "must be -1 (off) or >= 1: 0"),
        ("handshakes-per-source", "many", "not an integer: 'many'"),
        ("handshake-per-source", "3", "unknown key (did you mean 'handshakes-per-source'?)"),
    ],
)
def test_connection_limits_are_range_checked(key: str, value: str, message: str) -> None:
    text = f"acceptors:\n  - name: a\n    url: amqp://127.0.0.1:0\n    {key}: {value}\n"
    assert problems(text) == [f"b.yaml:4: acceptors[0].{key}: {message}"]


@pytest.mark.timeout(10)
def test_a_merge_key_bomb_is_refused_before_it_is_walked() -> None:
    """B-160, issue 15 attack: ten anchors each merging ten copies of the one before (620
    bytes) made the checker walk ~10^10 merges; the expansion is counted first, once per
    node, and refused with the file and line."""
    lines = ["a0: &a0 {max-delivery-attempts: 1}"]
    lines += [f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 10)}]}}" for i in range(1, 10)]
    lines.append("persistence: {<<: *a9}")
    found = problems("\n".join(lines) + "\n")
    assert len(found) == 1
    assert found[0].startswith("b.yaml:1: (yaml): aliases and merge keys expand 44 nodes to ")
    assert found[0].endswith("(at most 10 times the nodes written)")


@pytest.mark.timeout(10)
def test_aliases_within_the_expansion_limit_still_work() -> None:
    lines = ["address-settings:", '  "#": &base {max-delivery-attempts: 3}']
    lines += [f"  a{i}: {{<<: *base, redelivery-delay: {i}}}" for i in range(200)]
    config = parse("\n".join(lines) + "\n")
    assert config.address_settings["a199"].as_dict() == {
        "max_delivery_attempts": 3,
        "redelivery_delay": 199,
    }


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("open_", "close"), [("[", "]"), ("{a: ", "}")])
def test_yaml_nested_past_the_limit_is_a_problem_not_a_recursion_error(
    open_: str, close: str
) -> None:
    """B-160, issue 15 attack: PyYAML composes recursively; 3,000 nested lists raised
    RecursionError out of the loader (a traceback from `check-config`)."""
    text = "name: x\naddresses: " + open_ * 3000 + "1" + close * 3000 + "\n"
    assert problems(text) == ["b.yaml:2: (yaml): nested more than 64 deep"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("!!int abc", "'abc' is not a valid 'tag:yaml.org,2002:int' value"),
        ("!!bool maybe", "'maybe' is not a valid 'tag:yaml.org,2002:bool' value"),
        ("!!float x", "'x' is not a valid 'tag:yaml.org,2002:float' value"),
        ("!!timestamp bad", "'bad' is not a valid 'tag:yaml.org,2002:timestamp' value"),
        ("!foo bar", "the YAML tag '!foo' is not supported"),
        ("!foo {a: 1}", "the YAML tag '!foo' is not supported"),
        (
            "!!python/object:os.system ls",
            "the YAML tag 'tag:yaml.org,2002:python/object:os.system' is not supported",
        ),
    ],
)
def test_a_tag_the_loader_cannot_read_is_a_problem_not_an_exception(
    value: str, problem: str
) -> None:
    """B-160, issue 15 attack: a scalar its explicit tag cannot construct raised
    ValueError, KeyError or AttributeError out of the loader, an unknown tag
    ConstructorError (a traceback from `check-config`); now a problem with file and
    line. Nothing is ever constructed from a tag outside the core schema."""
    assert problems(f"name: x\npersistence:\n  enabled: {value}\n") == [
        f"b.yaml:3: (yaml): {problem}"
    ]
