"""No silent keys (issue 19): every key the loader accepts is read by code that acts on it.

The schema is walked (every address-setting, queue option and broker-level key) and each
field must either be read outside the modules that only check, default or print the
configuration, or be listed in the one table of keys amqpbroker does not implement
(core/unsupported.py), which the loader refuses at anything but the default. A listed key
that code reads is a stale entry: delete it from the table when you implement the key.

"Read" is an attribute load (`settings.redelivery_delay`) found by walking the AST of the
package. A read inside a copier (a function that only copies configuration into a
`QueueConfig`, such as the `default-*` settings of an auto-created queue) is not an effect
by itself: it flows into the field it is copied to, and counts when that field is read.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import typing
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

import amqpbroker
from amqpbroker.config import ConfigError, parse_artemis_xml, parse_config, schema
from amqpbroker.config.load import SETTING_TABLE
from amqpbroker.core import ResolvedSettings
from amqpbroker.core.settings import ADDRESS_FULL_POLICIES, CONFIG_DELETE_POLICIES
from amqpbroker.core.settings import SLOW_CONSUMER_POLICIES as SLOW
from amqpbroker.core.unsupported import UNSUPPORTED_QUEUE_OPTIONS, UNSUPPORTED_SETTINGS

ROOT = Path(amqpbroker.__file__).parent
# Modules that check, default, list or print configuration: a read there has no effect.
NOT_EFFECTS = ("config/", "core/settings.py", "core/unsupported.py")
# Functions that copy configuration into a QueueConfig (keyword or dict key = the field).
COPIERS = {
    ("core/broker.py", "_auto_queue"),
    ("config/schema.py", "queue_config"),
    ("core/settings.py", "queue_defaults"),  # default-* -> QueueConfig fields (B-110)
}
# Functions that only display configuration (the console's kind column, management
# attributes).
REPORTERS = {
    ("management/api.py", "queue_kinds"),
    ("management/amqp_address.py", "queue_attributes"),
}


@functools.cache
def _scan() -> tuple[set[str], dict[str, set[str]]]:
    """Attribute names read as effects, and copier flows (source attribute -> fields).
    Walked once, by the process that runs these tests, not at import: every xdist worker
    collects this module (docs/decisions.md, "Suite time, sixth pass")."""
    direct: set[str] = set()
    flows: dict[str, set[str]] = defaultdict(set)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip: set[int] = set()
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (rel, func.name) in REPORTERS:
                skip.update(id(node) for node in ast.walk(func))
            if (rel, func.name) not in COPIERS:
                continue
            for node in ast.walk(func):
                pairs: list[tuple[str, ast.expr]] = []
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "QueueConfig":
                    pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
                elif isinstance(node, ast.Dict):
                    pairs = [
                        (k.value, v)
                        for k, v in zip(node.keys, node.values, strict=True)
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    ]
                for target, value in pairs:
                    for sub in ast.walk(value):
                        if isinstance(sub, ast.Attribute):
                            flows[sub.attr].add(target)
                            skip.add(id(sub))
        if rel.startswith(NOT_EFFECTS):
            continue  # its copiers count (above), its reads do not
        for node in ast.walk(tree):
            is_load = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            if is_load and id(node) not in skip:
                direct.add(typing.cast(ast.Attribute, node).attr)
    return direct, flows


def is_read(name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether field `name` is read as an effect, directly or through a copy."""
    direct, flows = _scan()
    if name in direct:
        return True
    return any(is_read(t, seen | {name}) for t in flows.get(name, ()) if t not in seen)


SETTINGS = [f.name for f in dataclasses.fields(ResolvedSettings)]
QUEUE_OPTIONS = [f.name for f in dataclasses.fields(schema.QueueDef)]


def _broker_fields() -> list[str]:
    """`Class.field` of every broker-level key: BrokerConfig and the sections under it."""
    out: list[str] = []
    todo: list[type] = [schema.BrokerConfig]
    done: set[type] = {schema.QueueDef}  # queue options are walked on their own
    while todo:
        cls = todo.pop()
        done.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in ("address_settings", "source"):  # walked above; not a key
                continue
            out.append(f"{cls.__name__}.{f.name}")
            for kind in (*typing.get_args(hints[f.name]), hints[f.name]):
                if dataclasses.is_dataclass(kind) and isinstance(kind, type) and kind not in done:
                    todo.append(kind)
    return sorted(out)


KEYS = [(name, UNSUPPORTED_SETTINGS) for name in SETTINGS] + [
    (name, UNSUPPORTED_QUEUE_OPTIONS) for name in QUEUE_OPTIONS
]
KEY_IDS = [f"{'queue' if t is UNSUPPORTED_QUEUE_OPTIONS else 'setting'}:{n}" for n, t in KEYS]


@pytest.mark.parametrize(("name", "refused"), KEYS, ids=KEY_IDS)
def test_every_setting_and_queue_option_is_read_or_refused(
    name: str, refused: dict[str, str]
) -> None:
    """Issue 19: an accepted address-setting or queue option takes effect, or is in the
    refused table (and then no code reads it)."""
    if name in refused:
        assert not is_read(name), f"{name} is read by code: delete it from core/unsupported.py"
    else:
        assert is_read(name), f"{name} is accepted but no code reads it: implement or refuse"


@pytest.mark.parametrize("field", _broker_fields())
def test_every_broker_key_is_read(field: str) -> None:
    """Issue 19: every broker-level key (acceptors, http, persistence, event-log, ...)."""
    assert is_read(field.split(".")[1]), f"{field} is accepted but no code reads it"


def test_the_walk_sees_what_it_must() -> None:
    """The scan itself: a known effect is seen, a copy alone is not, reporters are ignored."""
    assert is_read("redelivery_delay")  # core/redelivery.py
    assert "default_max_consumers" not in _scan()[0]  # only copied into max_consumers...
    assert is_read("default_max_consumers")  # ...which core/attach.py reads
    assert set(UNSUPPORTED_SETTINGS) <= set(SETTINGS)
    assert set(UNSUPPORTED_QUEUE_OPTIONS) <= set(QUEUE_OPTIONS)


# -- the refusal, through the YAML loader and the broker.xml reader ----------------------

_CHOICES: dict[str, tuple[str, ...]] = {
    "address_full_policy": ADDRESS_FULL_POLICIES,
    "config_delete_queues": CONFIG_DELETE_POLICIES,
    "config_delete_addresses": CONFIG_DELETE_POLICIES,
    "slow_consumer_policy": SLOW,
}


def other_value(name: str, default: object) -> object:
    """A valid value that is not the default."""
    if name in _CHOICES:
        return next(c for c in _CHOICES[name] if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    return "x"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_SETTINGS))
def test_unsupported_setting_is_refused_unless_default(name: str) -> None:
    """Issue 19: `file:line: key: not supported by amqpbroker`; the default still loads."""
    key = name.replace("_", "-")
    default = getattr(ResolvedSettings(), name)
    value = other_value(name, default)
    text = yaml.safe_dump({"address-settings": {"orders": {key: value}}})
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="b.yaml")
    assert str(info.value).startswith(
        f"b.yaml:3: address-settings.orders.{key}: not supported by amqpbroker"
    )
    loaded = parse_config(yaml.safe_dump({"address-settings": {"orders": {key: default}}}))
    assert loaded.address_settings["orders"].as_dict() == {name: default}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_SETTINGS))
def test_unsupported_setting_is_refused_in_broker_xml(name: str) -> None:
    """Issue 19: the Artemis broker.xml reader refuses the same keys, at the element's line."""
    key = name.replace("_", "-")
    value = other_value(name, getattr(ResolvedSettings(), name))
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    xml = (
        '<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">\n'
        '<address-settings><address-setting match="orders">\n'
        f"<{key}>{shown}</{key}>\n"
        "</address-setting></address-settings></core></configuration>\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_artemis_xml(xml, source="b.xml")
    assert str(info.value).startswith(
        f"b.xml:3: address-settings.orders.{key}: not supported by amqpbroker"
    )


# Every queue option is implemented today (issue 19): the refusal path is then checked
# with a stand-in entry, so it stays tested for the next option that needs it.
QUEUE_CASES = sorted(UNSUPPORTED_QUEUE_OPTIONS) or ["ring_size"]


@pytest.mark.parametrize("name", QUEUE_CASES)
def test_unsupported_queue_option_is_refused_unless_default(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: queue options likewise, in YAML and as broker.xml queue attributes."""
    if name not in UNSUPPORTED_QUEUE_OPTIONS:
        monkeypatch.setitem(UNSUPPORTED_QUEUE_OPTIONS, name, "")
    key = name.replace("_", "-")
    default = getattr(schema.QueueDef(name="q"), name)
    value = other_value(name, default)
    queue = {"name": "q", key: value}
    text = yaml.safe_dump({"addresses": [{"name": "q", "anycast": [queue]}]})
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="b.yaml")
    assert f"addresses[0].anycast[0].{key}: not supported by amqpbroker" in str(info.value)
    loaded = parse_config(
        yaml.safe_dump({"addresses": [{"name": "q", "anycast": [{"name": "q", key: default}]}]})
    )
    assert loaded.addresses[0].anycast == (schema.QueueDef(name="q"),)
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    xml = (
        '<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">\n'
        '<addresses><address name="q"><anycast>\n'
        f'<queue name="q" {key}="{shown}"/>\n'
        "</anycast></address></addresses></core></configuration>\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_artemis_xml(xml, source="b.xml")
    assert f"b.xml:3: addresses[0].anycast[0].{key}: not supported by amqpbroker" in str(info.value)


def test_setting_table_covers_the_schema() -> None:
    """The loader accepts exactly the ResolvedSettings fields (so the walk above is the
    whole address-settings schema)."""
    assert set(SETTING_TABLE) == set(SETTINGS)
