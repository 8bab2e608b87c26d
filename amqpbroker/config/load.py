"""YAML config loading: every problem reported with file, line and key path.

The file is composed into YAML nodes (which keep their line numbers) and checked key by
key against the tables below. Nothing stops at the first problem: all of them are
collected into one `ConfigError`, one line each, in file order, in the form

    config/broker.yaml:12: acceptors[0].tsl: unknown key (did you mean 'tls'?)

A config with any problem is never used: the broker does not start on a config it does
not understand.

Scalars follow the YAML 1.2 core schema, not PyYAML's YAML 1.1 default: only `true` and
`false` are booleans, so `level: off`, `config-delete-queues: OFF` or an address named
`NO` stay strings; there are no sexagesimal or leading-zero octal integers and no
timestamps. `null` (or `~`, or nothing) leaves a key unset. Anchors, aliases and merge
keys (`<<: *defaults`) work; the keys a mapping sets itself win over merged ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import yaml

from amqpbroker.config.schema import (
    AcceptorConfig,
    AddressConfig,
    BrokerConfig,
    EventLogConfig,
    HttpConfig,
    MetricsConfig,
    PersistenceConfig,
    QueueDef,
    SecurityConfig,
    TlsConfig,
    UserConfig,
)
from amqpbroker.core import (
    AddressSettings,
    InvalidSelector,
    ResolvedSettings,
    RoutingType,
    WildcardConfig,
)
from amqpbroker.core.management import MANAGEMENT_ADDRESS
from amqpbroker.core.names import is_text
from amqpbroker.core.security import PERMISSIONS
from amqpbroker.core.selector import parse_selector
from amqpbroker.core.settings import (
    ADDRESS_FULL_POLICIES,
    CONFIG_DELETE_POLICIES,
    SLOW_CONSUMER_POLICIES,
)
from amqpbroker.core.unsupported import (
    UNSUPPORTED_QUEUE_OPTIONS,
    UNSUPPORTED_SETTINGS,
    unsupported_message,
)

ROUTING_TYPES = ("ANYCAST", "MULTICAST")
EVENT_LOG_LEVELS = ("off", "failures", "lifecycle")
CLIENT_AUTH = ("none", "optional", "required")
SASL_MECHANISMS = ("PLAIN", "EXTERNAL", "ANONYMOUS")
# `amqpbroker user hash`: scrypt$<log2 n>$<r>$<p>$<salt b64>$<key b64> (security/passwords.py)
_PASSWORD_HASH = re.compile(r"^scrypt\$\d+\$\d+\$\d+\$[A-Za-z0-9+/]+=*\$[A-Za-z0-9+/]+=*$")
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_MERGE_TAG = "tag:yaml.org,2002:merge"
# A YAML file's nesting and alias expansion (issue 15 attack, B-160): PyYAML composes
# recursively (a file nested a thousand deep raised RecursionError out of the loader), and
# the checker walks an alias or a merge key once per use (ten anchors each merging ten
# copies of the one before, 600 bytes, took hours). No real config nests past a handful.
MAX_YAML_DEPTH = 64
MAX_ALIAS_EXPANSION = 10  # nodes walked per node written, beyond the first 100,000
_FREE_EXPANSION = 100_000
_ENUMS: dict[str, tuple[str, ...]] = {
    "address_full_policy": ADDRESS_FULL_POLICIES,
    "slow_consumer_policy": SLOW_CONSUMER_POLICIES,
    "config_delete_queues": CONFIG_DELETE_POLICIES,
    "config_delete_addresses": CONFIG_DELETE_POLICIES,
}
_MISSING: Any = object()  # a converter's answer when the value had a problem (reported)

Converter = Callable[[yaml.Node, str], Any]
Check = Callable[[Any], str | None]


class CoreSchemaLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars (see the module docstring)."""


def _use_core_schema() -> None:
    replaced = {"tag:yaml.org,2002:" + t for t in ("bool", "int", "float", "timestamp")}
    CoreSchemaLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in replaced]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    # Leading-zero numbers ("010") match neither and stay strings: PyYAML reads them as octal.
    core = (
        ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
        ("int", r"[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+", "-+0123456789"),
        (
            "float",
            r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
            "-+.0123456789",
        ),
    )
    for tag, pattern, first in core:
        regexp = re.compile(rf"^(?:{pattern})$")
        CoreSchemaLoader.add_implicit_resolver("tag:yaml.org,2002:" + tag, regexp, list(first))


_use_core_schema()


class ConfigProblem(NamedTuple):
    """One problem: where it is and what is wrong."""

    source: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.path}: {self.message}"


class ConfigError(Exception):
    """Every problem found in a config file, one line each, in file order."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = sorted(problems, key=lambda p: p.line)
        super().__init__("\n".join(str(p) for p in self.problems))


def join_path(path: str, key: str) -> str:
    """`path.key`, quoting keys that are not plain words (patterns such as "orders.#")."""
    shown = key if _PLAIN_KEY.match(key) else json.dumps(key, ensure_ascii=False)
    return f"{path}.{shown}" if path else shown


def name_problem(name: str, what: str) -> str | None:
    """B-150 for names in configuration files: the rules the broker applies at attach."""
    if not name:
        return f"{what} name must not be empty"
    if any(ord(ch) < 0x20 for ch in name):
        return f"{what} name {name!r} contains a control character"
    if not is_text(name):
        return f"{what} name {name!r} is not Unicode text (a lone surrogate)"
    if name.count("::") > 1:
        return f"{what} name {name!r} has more than one '::'"
    return None


def _kind_name(kind: type) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return names.get(kind, kind.__name__)


def _article(kind: type) -> str:
    return "an" if _kind_name(kind)[0] in "aeiou" else "a"


# Upper bounds of numeric keys (issue 15): what the code can do with the value.
INT32_MAX = 2**31 - 1  # Artemis `int` settings: counts, page sizes, consumers
INT64_MAX = 2**63 - 1  # Artemis `long` settings: byte sizes, message counts
# A duration in ms gets added to an epoch-ms time (journaled in 64 bits) and multiplied
# as a float (redelivery back-off): 10**15 ms (~31,700 years) stays exact in a double
# and far inside 64 bits.
MS_MAX = 10**15


@dataclass(frozen=True, slots=True)
class Range:
    """The range of a numeric key: `low`..`high`, and -1 too when `minus_one` says what
    it means there ("off", "unlimited"), as Artemis allows it. A `Check`."""

    low: float
    high: float
    minus_one: str | None = None
    span: bool = False  # say "between low and high" whichever bound is broken

    def __call__(self, value: float) -> str | None:
        if self.minus_one is not None and value == -1:
            return None
        if self.span and not self.low <= value <= self.high:
            return f"must be between {self.low:g} and {self.high:g}: {value!r}"
        if value < self.low:
            if self.minus_one is not None:
                return f"must be -1 ({self.minus_one}) or >= {self.low}: {value!r}"
            return f"must be >= {self.low}: {value!r}"
        if value > self.high:
            return f"must be <= {self.high}: {value!r}"
        return None


# Artemis ByteUtil's sizes as text ("10MB", "512KiB", "1g"), binary multiples as in
# Artemis, so `max-size-bytes: 10MB` copied from a broker.xml means what it meant there
# (user pass, session 9): for every key that ends in `-bytes`, and `global-max-size`.
# ASCII digits only, at most 30 (eighth attack pass): `\d` and `int()` took fullwidth or
# Arabic-Indic digits as numbers, and `int()` of more than 4,300 raised ValueError out of
# the loader (a management request's `addAddressSettings`: an internal-error close). 30
# digits are past every range, so the range check still names the bound.
TEXT_BYTES = re.compile(r"^[ \t]*([0-9]{1,30})[ \t]*(ki?|mi?|gi?)?(b)?[ \t]*$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def is_size_key(key: str) -> bool:
    """Whether a (kebab-case) key is a byte size that takes `text_bytes` units."""
    return key.endswith("-bytes") or key == "global-max-size"


def text_bytes(text: str) -> int | None:
    """`text` as a number of bytes ("10MiB" -> 10485760); None when it is no size."""
    if (m := TEXT_BYTES.match(text)) is None:
        return None
    return int(m.group(1)) * _BYTE_UNITS[(m.group(2) or "")[:1].lower()]


def _ms(*, minus_one: str | None = None, low: int = 0) -> Range:
    return Range(low, MS_MAX, minus_one)


# Numeric keys outside address-settings, by key path ("queue." for addresses[].*cast[]).
NUMERIC_KEYS: dict[str, Range] = {
    "message-expiry-scan-period": _ms(minus_one="off"),  # B-084
    "address-queue-scan-period": _ms(minus_one="off"),  # B-111
    "max-redelivery-records": Range(0, INT32_MAX, "no cap"),  # B-096
    "id-cache-size": Range(0, INT32_MAX),  # B-012
    "global-max-size": Range(0, INT64_MAX, "half the memory limit"),  # B-151
    "max-disk-usage": Range(0, 100, "off"),  # percent of the data dir's file system
    "disk-scan-period": _ms(low=1),  # ms between disk-usage checks
    "event-log.max-file-bytes": Range(1, INT64_MAX),
    "event-log.max-file-age": _ms(low=1),
    "event-log.max-total-bytes": Range(1, INT64_MAX, "off"),  # issue 17
    "event-log.max-age": _ms(minus_one="off", low=1),
    "event-log.min-free-bytes": Range(0, INT64_MAX),
    "http.read-timeout": Range(100, 600_000, span=True),  # ms
    "http.max-connections": Range(1, 10_000, span=True),
    "http.sample-interval": Range(100, 60_000, span=True),  # ms (issue 24)
    "queue.max-consumers": Range(0, INT32_MAX, "unlimited"),
    "queue.ring-size": Range(0, INT64_MAX, "off"),
    "queue.group-buckets": Range(0, INT32_MAX, "unlimited"),  # B-127
    "queue.consumers-before-dispatch": Range(0, INT32_MAX),  # B-128
    "queue.delay-before-dispatch": _ms(minus_one="off"),
}


# What YAML 1.1 (PyYAML's default, Artemis-era tools) read as booleans; the core schema
# used here (YAML 1.2) reads them as text: said so when a boolean key gets one (user pass).
_YAML11_BOOLS = frozenset({"yes", "no", "on", "off", "y", "n"})


class Checker:
    """Walks YAML nodes, converting values and collecting problems.

    Converters return `_MISSING` for a value with a problem (already reported), so the
    caller leaves that key out and carries on with the rest of the file.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[ConfigProblem] = []
        self._constructor = CoreSchemaLoader("")
        self.queue_lines: dict[str, int] = {}  # B-001: queue names are broker-wide

    def problem(self, node: yaml.Node, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(self.source, node.start_mark.line + 1, path, message))

    # -- scalars ------------------------------------------------------------------------
    def value(self, node: yaml.Node) -> Any:
        return self._constructor.construct_object(node, deep=True)

    def key(self, node: yaml.Node) -> Any:
        """A mapping key as a value; None for a non-scalar key (never hashable)."""
        return self.value(node) if isinstance(node, yaml.ScalarNode) else None

    def scalar(self, node: yaml.Node, path: str, kind: type, *, nullable: bool = False) -> Any:
        """A scalar of `kind` (bool is not an int; an int is a float), else _MISSING."""
        if not isinstance(node, yaml.ScalarNode):
            shape = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
            self.problem(node, path, f"expected {_article(kind)} {_kind_name(kind)}, not a {shape}")
            return _MISSING
        value = self.value(node)
        if value is None:
            if nullable:
                return None
            self.problem(node, path, f"expected {_article(kind)} {_kind_name(kind)}, not null")
            return _MISSING
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            message = f"not {_article(kind)} {_kind_name(kind)}: {value!r}"
            if kind is bool and str(value).lower() in _YAML11_BOOLS:
                message += " (write true or false: YAML 1.2 reads yes/no/on/off as text)"
            self.problem(node, path, message)
            return _MISSING
        if kind is float and not math.isfinite(typing.cast(float, value)):
            self.problem(node, path, f"not a finite number: {value!r}")
            return _MISSING
        return value

    def typed(self, kind: type, check: Check | None = None, *, nullable: bool = False) -> Converter:
        """A converter for a scalar of `kind` that passes `check` (None: no problem)."""

        def convert(node: yaml.Node, path: str) -> Any:
            value = self.scalar(node, path, kind, nullable=nullable)
            if value is _MISSING or value is None or check is None:
                return value
            if message := check(value):
                self.problem(node, path, message)
                return _MISSING
            return value

        return convert

    def path(self, check: Check | None = None, *, nullable: bool = False) -> Converter:
        """A file or directory path; a leading `~` is the user's home, as in a shell (user
        pass: `data-dir: ~/data` made a directory named `~` in the working directory)."""
        as_str = self.typed(str, check, nullable=nullable)

        def convert(node: yaml.Node, path: str) -> Any:
            value = as_str(node, path)
            return os.path.expanduser(value) if isinstance(value, str) else value

        return convert

    def size(self, check: Check, *, nullable: bool = False) -> Converter:
        """A byte size: an integer, or Artemis text such as "10MB" (`text_bytes`)."""
        as_int = self.typed(int, check, nullable=nullable)

        def convert(node: yaml.Node, path: str) -> Any:
            if isinstance(node, yaml.ScalarNode) and isinstance(text := self.value(node), str):
                value = text_bytes(text)
                if value is None:
                    message = f"not a size (an integer, or such as 10MiB, 512KB, 2G): {text!r}"
                    self.problem(node, path, message)
                    return _MISSING
                if problem := check(value):
                    self.problem(node, path, problem)
                    return _MISSING
                return value
            return as_int(node, path)

        return convert

    def choice(self, choices: tuple[str, ...]) -> Converter:
        def convert(node: yaml.Node, path: str) -> Any:
            value = self.scalar(node, path, str)
            if value is not _MISSING and value not in choices:
                self.problem(node, path, f"must be one of {', '.join(choices)}: {value!r}")
                return _MISSING
            return value

        return convert

    def strings(self, node: yaml.Node, path: str, choices: tuple[str, ...] = ()) -> Any:
        """A list of strings (each one of `choices`, when given) as a tuple."""
        if not isinstance(node, yaml.SequenceNode):
            self.problem(node, path, "expected a list of strings")
            return _MISSING
        convert = self.choice(choices) if choices else self.typed(str)
        values = [convert(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        return _MISSING if _MISSING in values else tuple(values)

    # -- compounds ----------------------------------------------------------------------
    def pairs(
        self, node: yaml.MappingNode, path: str, _seen: frozenset[int] = frozenset()
    ) -> list[tuple[yaml.Node, yaml.Node]]:
        """(key, value) nodes with merge keys applied: own keys win, then earlier merges."""
        own: list[tuple[yaml.Node, yaml.Node]] = []
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else []
            for source in sources or [value_node]:
                if not isinstance(source, yaml.MappingNode) or id(source) in _seen:
                    self.problem(
                        source, join_path(path, "<<"), "merges only mappings, not recursively"
                    )
                    continue
                merged.extend(self.pairs(source, path, _seen | {id(node)}))
        taken: set[Any] = {self.key(k) for k, _ in own}
        out: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in merged:
            key = self.key(key_node)
            if key is None or key not in taken:
                taken.add(key)
                out.append((key_node, value_node))
        return out + own

    def entries(self, node: yaml.Node, path: str) -> list[tuple[yaml.Node, str, yaml.Node]]:
        """(key node, key, value node) of a mapping keyed by free-form names or patterns."""
        if not isinstance(node, yaml.MappingNode):
            if not (isinstance(node, yaml.ScalarNode) and self.value(node) is None):
                self.problem(node, path, "expected a mapping")
            return []
        out = []
        seen: set[str] = set()
        for key_node, value_node in self.pairs(node, path):
            key = self.key(key_node)
            if not isinstance(key, str):
                self.problem(key_node, path, f"keys must be strings: {key!r}")
            elif key in seen:
                self.problem(key_node, join_path(path, key), "duplicate key")
            else:
                seen.add(key)
                out.append((key_node, key, value_node))
        return out

    def mapping(
        self,
        node: yaml.Node,
        path: str,
        handlers: Mapping[str, Converter],
        *,
        required: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Check a mapping against `handlers` (kebab key -> converter); return converted
        values by snake_case name for the keys present and valid. An empty value
        (`persistence:` alone) is an empty mapping."""
        if isinstance(node, yaml.ScalarNode) and self.value(node) is None:
            node = yaml.MappingNode("tag:yaml.org,2002:map", [], node.start_mark, node.end_mark)
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, path or "(top level)", "expected a mapping")
            return {}
        out: dict[str, Any] = {}
        seen: set[str] = set()
        for key_node, key, value_node in self.entries(node, path):
            key_path = join_path(path, key)
            seen.add(key)
            handler = handlers.get(key)
            if handler is None:
                hint = difflib.get_close_matches(key, list(handlers), n=1)
                suffix = f" (did you mean '{hint[0]}'?)" if hint else ""
                self.problem(key_node, key_path, f"unknown key{suffix}")
                continue
            value = handler(value_node, key_path)
            if value is not _MISSING:
                out[key.replace("-", "_")] = value
        for key in required:
            if key not in seen:
                self.problem(node, join_path(path, key), "required key is missing")
        return out

    def items(self, node: yaml.Node, path: str) -> list[tuple[yaml.Node, str]]:
        if isinstance(node, yaml.ScalarNode) and self.value(node) is None:
            return []
        if not isinstance(node, yaml.SequenceNode):
            self.problem(node, path, "expected a list")
            return []
        return [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]

    def named(self, what: str) -> Converter:
        """A name following B-150, reported at the name's own line."""

        def convert(name_node: yaml.Node, path: str) -> Any:
            value = self.scalar(name_node, path, str)
            if value is not _MISSING and (message := name_problem(value, what)):
                self.problem(name_node, path, message)
                return _MISSING
            return value

        return convert

    def value_node(self, node: yaml.Node, key: str) -> yaml.Node:
        """The value node of `key` in mapping `node` (for the line of a later problem)."""
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if self.key(key_node) == key:
                    return typing.cast(yaml.Node, value_node)
        return node


# -- address-settings -------------------------------------------------------------------


def _setting_table() -> dict[str, tuple[type, Check | None]]:
    """Kind and range check of every address-setting (B-103), keyed by field name.

    Derived from `ResolvedSettings`, so a setting added there is accepted here under its
    kebab-case name; a numeric one must have its range in `SETTING_RANGES` (KeyError at
    import otherwise). Ranges: B-067 (Artemis checks only the collision-avoidance factor;
    amqpbroker also refuses a negative delay and a multiplier below 1.0), issue 15.
    """
    hints = typing.get_type_hints(ResolvedSettings)
    table: dict[str, tuple[type, Check | None]] = {}
    for f in dataclasses.fields(ResolvedSettings):
        kind = hints[f.name]
        if isinstance(kind, types.UnionType):
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        numeric = kind in (int, float)
        table[f.name] = (kind, SETTING_RANGES[f.name] if numeric else None)
    return table


# Every numeric address-setting's range (issue 15): -1 where Artemis gives it a meaning,
# nothing else negative; Artemis `int` settings up to INT32_MAX, `long` ones up to
# INT64_MAX, ms durations up to MS_MAX.
SETTING_RANGES: dict[str, Range] = {
    "max_delivery_attempts": Range(0, INT32_MAX, "unlimited"),  # B-060: 0 is too
    "redelivery_delay": _ms(),
    "redelivery_delay_multiplier": Range(1.0, math.inf),  # finite: checked as a float
    "max_redelivery_delay": _ms(),
    "redelivery_collision_avoidance_factor": Range(0.0, 1.0, span=True),
    "expiry_delay": _ms(minus_one="off"),
    "min_expiry_delay": _ms(minus_one="off"),
    "max_expiry_delay": _ms(minus_one="off"),
    "auto_delete_addresses_delay": _ms(),
    "auto_delete_queues_delay": _ms(),
    "auto_delete_queues_message_count": Range(0, INT64_MAX, "off"),
    "default_max_consumers": Range(0, INT32_MAX, "unlimited"),
    "default_consumers_before_dispatch": Range(0, INT32_MAX),
    "default_delay_before_dispatch": _ms(minus_one="off"),
    "default_group_buckets": Range(0, INT32_MAX, "unlimited"),
    "default_ring_size": Range(0, INT64_MAX, "off"),
    "retroactive_message_count": Range(0, INT64_MAX),
    "max_size_bytes": Range(0, INT64_MAX, "unlimited"),
    "max_size_messages": Range(0, INT64_MAX, "unlimited"),
    "max_size_bytes_reject_threshold": Range(0, INT64_MAX, "off"),
    "page_size_bytes": Range(1, INT32_MAX),
    "max_read_page_bytes": Range(1, INT64_MAX, "unlimited"),
    "max_read_page_messages": Range(1, INT64_MAX, "unlimited"),
    "management_browse_page_size": Range(0, INT32_MAX),
    "slow_consumer_threshold": Range(0, INT64_MAX, "off"),
    "slow_consumer_check_period": Range(1, MS_MAX // 1000),  # seconds
    "redistribution_delay": _ms(minus_one="off"),
}
SETTING_TABLE = _setting_table()


_ADDRESS_VALUED = ("dead_letter_address", "expiry_address")


def _setting_converter(c: Checker, name: str) -> Converter:
    kind, check = SETTING_TABLE[name]
    if kind is RoutingType:
        choose = c.choice(ROUTING_TYPES)
        return lambda n, p: _nullable(c, n, lambda: _map(choose(n, p), RoutingType))
    if name in _ENUMS:
        choose = c.choice(_ENUMS[name])
        return lambda n, p: _nullable(c, n, lambda: choose(n, p))
    if name in _ADDRESS_VALUED:  # "" means none (B-071); other names follow B-150
        return c.typed(str, lambda v: name_problem(v, "address") if v else None, nullable=True)
    if is_size_key(name.replace("_", "-")) and check is not None:
        return c.size(check, nullable=True)
    return c.typed(kind, check, nullable=True)  # null: not set by this entry


def _nullable(c: Checker, node: yaml.Node, convert: Callable[[], Any]) -> Any:
    if isinstance(node, yaml.ScalarNode) and c.value(node) is None:
        return None
    return convert()


def _map(value: Any, function: Callable[[Any], Any]) -> Any:
    return value if value is _MISSING else function(value)


def _patterns(
    c: Checker,
    node: yaml.Node,
    path: str,
    wildcards: WildcardConfig | None,
    entry: Callable[[yaml.Node, str], Any],
    keys: Collection[str] = (),
) -> dict[str, Any]:
    """A mapping keyed by match patterns (B-101: '#' only last), in file order.

    A key of an entry (`keys`) in a pattern's place, with no mapping under it, is what an
    unquoted `#:` leaves (YAML reads it as a comment): said so, not `expected a mapping`
    (user pass)."""
    out: dict[str, Any] = {}
    for key_node, pattern, value_node in c.entries(node, path):
        entry_path = join_path(path, pattern)
        if pattern in keys and not isinstance(value_node, yaml.MappingNode):
            hint = (
                f"{pattern!r} is a setting, not a match pattern: is the pattern above it "
                'missing? (an unquoted # starts a YAML comment: write "#":)'
            )
            c.problem(key_node, entry_path, hint)
            continue
        message = name_problem(pattern, "match")
        if message is None and wildcards is not None:
            message = wildcards.validate_pattern(pattern)
        if message:
            c.problem(key_node, entry_path, message)
        value = entry(value_node, entry_path)
        if not message and value is not _MISSING:
            out[pattern] = value
    return out


def _address_settings(c: Checker, wildcards: WildcardConfig | None) -> Converter:
    handlers = {name.replace("_", "-"): _setting_converter(c, name) for name in SETTING_TABLE}

    defaults = ResolvedSettings()

    def entry(node: yaml.Node, path: str) -> AddressSettings:
        values = c.mapping(node, path, handlers)
        _refuse_unsupported(c, node, path, values, UNSUPPORTED_SETTINGS, defaults)
        return AddressSettings.of(**{k: v for k, v in values.items() if v is not None})

    return lambda node, path: _patterns(c, node, path, wildcards, entry, handlers)


def _refuse_unsupported(
    c: Checker,
    node: yaml.Node,
    path: str,
    values: dict[str, Any],
    table: Mapping[str, str],
    defaults: object,
) -> None:
    """Issue 19, no silent keys: a key of `table` (core/unsupported.py) that is set to
    anything but its default (an attribute of `defaults`) is reported and dropped."""
    for name in [n for n in values if n in table]:
        default = getattr(defaults, name)
        if values[name] is None or values[name] == default:
            continue
        key = name.replace("_", "-")
        message = unsupported_message(table[name], default)
        c.problem(c.value_node(node, key), join_path(path, key), message)
        del values[name]


# -- acceptors, addresses, the rest -----------------------------------------------------


def _tls(c: Checker, node: yaml.Node, path: str) -> Any:
    values = c.mapping(
        node,
        path,
        {
            "cert-file": c.path(),
            "key-file": c.path(),
            "ca-file": c.path(nullable=True),
            "client-auth": c.choice(CLIENT_AUTH),
        },
        required=("cert-file", "key-file"),
    )
    return TlsConfig(**values) if {"cert_file", "key_file"} <= values.keys() else _MISSING


def _message_size(value: int) -> str | None:
    """B-152 max-message-size: bytes, 0 for no limit; a ulong on the wire (AMQP 2.7.3)."""
    if 0 <= value < 2**64:
        return None
    return f"must be 0 (no limit) or a size in bytes below 2^64: {value!r}"


def _uint_ms_or_off(value: int) -> str | None:
    """An AMQP idle-timeout is a uint of ms; -1 and 0 turn it off (Artemis)."""
    return None if -1 <= value <= 0xFFFFFFFF else f"must be -1, 0 (off) or 1..4294967295: {value}"


def _acceptor(c: Checker, node: yaml.Node, path: str) -> Any:
    def name(n: yaml.Node, p: str) -> Any:
        value = c.named("acceptor")(n, p)
        if value == "http":  # DATA_DIR/ports.json has one key per acceptor, plus "http"
            c.problem(n, p, "acceptor name 'http' is reserved (ports.json uses it for HTTP)")
            return _MISSING
        return value

    values = c.mapping(
        node,
        path,
        {
            "name": name,
            "url": c.typed(str),
            "anycast-prefix": c.typed(str, nullable=True),
            "multicast-prefix": c.typed(str, nullable=True),
            "tls": lambda n, p: _tls(c, n, p),
            "amqp-treat-reject-as-unmodified-delivery-failed": c.typed(bool),
            "amqp-duplicate-detection": c.typed(bool),
            "max-message-size": c.typed(int, _message_size),  # B-152
            "handshake-timeout": c.typed(int, Range(-1, 86_400, span=True)),  # s
            "amqp-idle-timeout": c.typed(int, _uint_ms_or_off),
            "connections-allowed": c.typed(int, Range(1, INT32_MAX, "off")),
            "handshakes-per-source": c.typed(int, Range(1, INT32_MAX, "off")),
        },
        required=("name", "url"),
    )
    if "url" not in values:
        return _MISSING
    url_node, url_path = c.value_node(node, "url"), join_path(path, "url")
    url = values["url"]
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname or port is None:
        expected = "expected amqp://HOST:PORT or amqps://HOST:PORT (port 0-65535)"
        c.problem(url_node, url_path, f"{expected}: {url!r}")
        return _MISSING
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        c.problem(
            url_node,
            url_path,
            f"only amqp[s]://HOST:PORT is read; acceptor options are keys of the acceptor: {url!r}",
        )
        return _MISSING
    if parts.scheme == "amqps" and c.value_node(node, "tls") is node:
        c.problem(url_node, url_path, "an amqps:// acceptor needs a tls: section")
        return _MISSING
    if parts.scheme == "amqp" and c.value_node(node, "tls") is not node:
        tls_node = next(k for k, v in node.value if c.key(k) == "tls")
        c.problem(tls_node, join_path(path, "tls"), "tls: is read only for amqps:// acceptors")
        return _MISSING
    if "name" not in values or (parts.scheme == "amqps" and "tls" not in values):
        return _MISSING
    return AcceptorConfig(scheme=parts.scheme, host=parts.hostname, port=port, **values)


def _acceptors(c: Checker, node: yaml.Node, path: str) -> Any:
    if isinstance(node, yaml.ScalarNode) and c.value(node) is None:
        return _MISSING  # `acceptors:` alone is unset: the default acceptor, not none
    found: list[AcceptorConfig] = []
    lines: dict[str, int] = {}
    for item, item_path in c.items(node, path):
        acceptor = _acceptor(c, item, item_path)
        if acceptor is _MISSING:
            continue
        name_node = c.value_node(item, "name")
        if acceptor.name in lines:
            also = f"also at line {lines[acceptor.name]}"
            c.problem(name_node, join_path(item_path, "name"), f"duplicate acceptor name ({also})")
            continue
        lines[acceptor.name] = name_node.start_mark.line + 1
        found.append(acceptor)
    return tuple(found)


_QUEUE_DEFAULTS = QueueDef(name="")


def _queue(c: Checker, node: yaml.Node, path: str) -> Any:
    def selector(n: yaml.Node, p: str) -> Any:
        text = c.scalar(n, p, str, nullable=True)
        if text:
            try:
                parse_selector(text)
            except InvalidSelector as e:
                c.problem(n, p, f"invalid filter: {str(e).removeprefix('Invalid filter: ')}")
                return _MISSING
        return text

    values = c.mapping(
        node,
        path,
        {
            "name": c.named("queue"),
            "durable": c.typed(bool),
            "filter": selector,
            "max-consumers": c.typed(int, NUMERIC_KEYS["queue.max-consumers"]),
            "purge-on-no-consumers": c.typed(bool),
            "exclusive": c.typed(bool),
            "group-rebalance": c.typed(bool),
            "group-rebalance-pause-dispatch": c.typed(bool),
            "group-buckets": c.typed(int, NUMERIC_KEYS["queue.group-buckets"]),
            "group-first-key": c.typed(str, nullable=True),
            "consumers-before-dispatch": c.typed(
                int, NUMERIC_KEYS["queue.consumers-before-dispatch"]
            ),
            "delay-before-dispatch": c.typed(int, NUMERIC_KEYS["queue.delay-before-dispatch"]),
            "last-value-key": c.typed(str, nullable=True),
            "last-value": c.typed(bool),
            "non-destructive": c.typed(bool),
            "ring-size": c.typed(int, NUMERIC_KEYS["queue.ring-size"]),
        },
        required=("name",),
    )
    _refuse_unsupported(c, node, path, values, UNSUPPORTED_QUEUE_OPTIONS, _QUEUE_DEFAULTS)
    if "name" not in values:
        return _MISSING
    name, name_node = values["name"], c.value_node(node, "name")
    line = c.queue_lines.get(name)
    if line is not None:
        c.problem(
            name_node,
            join_path(path, "name"),
            f"queue name {name!r} is used more than once (also at line {line}); "
            "queue names are unique across the broker",
        )
        return _MISSING
    c.queue_lines[name] = name_node.start_mark.line + 1
    return QueueDef(**values)


def _addresses(c: Checker, node: yaml.Node, path: str) -> Any:
    def queues(n: yaml.Node, p: str) -> Any:
        found = [_queue(c, item, item_path) for item, item_path in c.items(n, p)]
        return tuple(q for q in found if q is not _MISSING)

    out: list[AddressConfig] = []
    lines: dict[str, int] = {}
    for item, item_path in c.items(node, path):
        values = c.mapping(
            item,
            item_path,
            {"name": c.named("address"), "anycast": queues, "multicast": queues},
            required=("name",),
        )
        if "name" not in values:
            continue
        name_node = c.value_node(item, "name")
        if values["name"] == MANAGEMENT_ADDRESS:  # B-160: answered by the broker, never routed
            message = f"{MANAGEMENT_ADDRESS} is the management address: it cannot be configured"
            c.problem(name_node, join_path(item_path, "name"), message)
            continue
        if values["name"] in lines:
            also = f"also at line {lines[values['name']]}"
            c.problem(name_node, join_path(item_path, "name"), f"duplicate address name ({also})")
            continue
        lines[values["name"]] = name_node.start_mark.line + 1
        present = frozenset(k.upper() for k in ("anycast", "multicast") if k in values)
        out.append(AddressConfig(routing_types=present, **values))
    return tuple(out)


def _report_path(value: str) -> str | None:
    """`http.analyze-report`: a report.html (or summary.json) `amqpbroker analyze` wrote."""
    if not value or "\x00" in value:
        return "must be a non-empty path"
    if not value.endswith((".html", ".json")):
        return f"must name an analyze report (.html or .json): {value!r}"
    return None


def _bind(c: Checker, node: yaml.Node, path: str) -> Any:
    """`http.bind` as text; a bare port (`bind: 8161`) is told the form (user pass)."""
    if isinstance(node, yaml.ScalarNode) and type(port := c.value(node)) is int:
        c.problem(node, path, f"expected HOST:PORT, such as 127.0.0.1:{port}, not a port alone")
        return _MISSING
    return c.typed(str)(node, path)


def _http(c: Checker, node: yaml.Node, path: str) -> Any:
    values = c.mapping(
        node,
        path,
        {
            "bind": lambda n, p: _bind(c, n, p),
            "enabled": c.typed(bool),
            "read-timeout": c.typed(int, NUMERIC_KEYS["http.read-timeout"]),  # ms
            "max-connections": c.typed(int, NUMERIC_KEYS["http.max-connections"]),
            "sample-interval": c.typed(int, NUMERIC_KEYS["http.sample-interval"]),  # ms
            "analyze-report": c.path(_report_path, nullable=True),
        },
    )
    bind = values.pop("bind", None)
    if bind is not None:
        host, _, port_text = bind.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")  # [::1]:8161
        if not host or not port_text.isdigit() or int(port_text) > 65535:
            bind_node = c.value_node(node, "bind")
            message = f"expected HOST:PORT (port 0-65535): {bind!r}"
            c.problem(bind_node, join_path(path, "bind"), message)
            return _MISSING
        values.update(host=host, port=int(port_text))
    return HttpConfig(**values)


def _wildcards(c: Checker, node: yaml.Node, path: str) -> Any:
    word = c.typed(str, lambda v: None if v else "must not be empty")
    values = c.mapping(
        node,
        path,
        {"enabled": c.typed(bool), "delimiter": word, "any-words": word, "single-word": word},
    )
    config = WildcardConfig(**values)
    if len({config.delimiter, config.any_words, config.single_word}) < 3:
        c.problem(node, path, "delimiter, any-words and single-word must all differ")
        return _MISSING
    return config


def _security(c: Checker, wildcards: WildcardConfig | None) -> Converter:
    def users(node: yaml.Node, path: str) -> Any:
        def password_hash(n: yaml.Node, p: str) -> Any:
            value = c.scalar(n, p, str)
            if value is not _MISSING and not _PASSWORD_HASH.match(value):
                c.problem(n, p, "not a password hash (make one with `amqpbroker user hash`)")
                return _MISSING
            return value

        out = {}
        for _, name, value in c.entries(node, path):
            user_path = join_path(path, name)
            if message := name_problem(name, "user"):
                c.problem(value, user_path, message)
                continue
            values = c.mapping(
                value,
                user_path,
                {"password-hash": password_hash, "roles": c.strings},
                required=("password-hash",),
            )
            if "password_hash" in values:
                out[name] = UserConfig(**values)
        return out

    permissions = {perm: c.strings for perm in sorted(PERMISSIONS)}

    def entry(node: yaml.Node, path: str) -> dict[str, tuple[str, ...]]:
        values = c.mapping(node, path, permissions)
        return {perm.replace("_", "-"): roles for perm, roles in values.items()}

    def convert(node: yaml.Node, path: str) -> Any:
        values = c.mapping(
            node,
            path,
            {
                "enabled": c.typed(bool),
                "sasl-mechanisms": lambda n, p: c.strings(n, p, SASL_MECHANISMS),
                "allow-plain-without-tls": c.typed(bool),
                "users": users,
                "security-settings": lambda n, p: _patterns(c, n, p, wildcards, entry, PERMISSIONS),
            },
        )
        security = SecurityConfig(**values)
        if security.enabled and not security.sasl_mechanisms:
            mechanisms = c.value_node(node, "sasl-mechanisms")
            message = "must not be empty when security is enabled (no client could connect)"
            c.problem(mechanisms, join_path(path, "sasl-mechanisms"), message)
            return _MISSING
        return security

    return convert


def _body_hash(c: Checker) -> Converter:
    """`event-log.body-hash`: true, false or keyed (EventLogConfig)."""

    def convert(node: yaml.Node, path: str) -> Any:
        value = c.value(node) if isinstance(node, yaml.ScalarNode) else None
        if value is True or value is False or value == "keyed":
            return value
        c.problem(node, path, f"must be true, false or keyed: {value!r}")
        return _MISSING

    return convert


def _event_log(c: Checker, node: yaml.Node, path: str) -> Any:
    s = c.typed
    values = c.mapping(
        node,
        path,
        {
            "enabled": s(bool),
            "level": c.choice(EVENT_LOG_LEVELS),
            "properties": c.strings,
            "body-hash": _body_hash(c),
            "max-file-bytes": c.size(NUMERIC_KEYS["event-log.max-file-bytes"]),
            "max-file-age": s(int, NUMERIC_KEYS["event-log.max-file-age"]),
            "compress": s(bool),
            # null: the default, a share of the file system (EventLogConfig)
            "max-total-bytes": c.size(NUMERIC_KEYS["event-log.max-total-bytes"], nullable=True),
            "max-age": s(int, NUMERIC_KEYS["event-log.max-age"]),
            "keep-until-analyzed": s(bool),
            "min-free-bytes": c.size(NUMERIC_KEYS["event-log.min-free-bytes"], nullable=True),
        },
    )
    config = EventLogConfig(**values)
    total = config.max_total_bytes
    if total is not None and 0 <= total < config.max_file_bytes:
        # The open file alone (never deleted) would be over it: nothing else kept.
        message = f"must be -1 (off) or >= max-file-bytes ({config.max_file_bytes}): {total}"
        c.problem(
            c.value_node(node, "max-total-bytes"), join_path(path, "max-total-bytes"), message
        )
        return _MISSING
    return config


def _section(c: Checker, cls: type, table: dict[str, Converter]) -> Converter:
    return lambda node, path: cls(**c.mapping(node, path, table))


def check_tree(root: yaml.Node | None, *, source: str) -> BrokerConfig:
    """Check a composed node tree (from YAML, or built from broker.xml) and build the config.

    Raises:
        ConfigError: every problem found.
    """
    c = Checker(source)
    if root is None:  # an empty file: every default
        return BrokerConfig(source=source)
    # Here, not only in `parse_config`: broker.xml's tree is typed by YAML's resolvers too
    # (eighth attack pass: `<global-max-size>` of 5,000 digits raised ValueError out).
    if problems := _tag_problems(root, source):
        raise ConfigError(problems)
    # wildcard-addresses first: the patterns of address-settings depend on it (B-101).
    wildcards: WildcardConfig | None = WildcardConfig()
    wildcards_node = c.value_node(root, "wildcard-addresses")
    if wildcards_node is not root:
        wildcards = _wildcards(c, wildcards_node, "wildcard-addresses")
        if wildcards is _MISSING:
            wildcards = None  # patterns cannot be judged against a broken config
    s = c.typed
    values = c.mapping(
        root,
        "",
        {
            "name": s(str, lambda v: None if v else "must not be empty"),
            "data-dir": c.path(nullable=True),
            "acceptors": lambda n, p: _acceptors(c, n, p),
            "http": lambda n, p: _http(c, n, p),
            "persistence": _section(
                c,
                PersistenceConfig,
                {
                    "enabled": s(bool),
                    "sync": s(bool),
                    "persist-delivery-count-before-delivery": s(bool),
                },
            ),
            "message-expiry-scan-period": s(int, NUMERIC_KEYS["message-expiry-scan-period"]),
            "address-queue-scan-period": s(int, NUMERIC_KEYS["address-queue-scan-period"]),
            "max-redelivery-records": s(int, NUMERIC_KEYS["max-redelivery-records"]),
            "id-cache-size": s(int, NUMERIC_KEYS["id-cache-size"]),
            "global-max-size": c.size(NUMERIC_KEYS["global-max-size"]),
            "max-disk-usage": s(int, NUMERIC_KEYS["max-disk-usage"]),
            "disk-scan-period": s(int, NUMERIC_KEYS["disk-scan-period"]),
            "event-log": lambda n, p: _event_log(c, n, p),
            "metrics": _section(c, MetricsConfig, {"artemis-names": s(bool)}),
            "wildcard-addresses": lambda n, p: wildcards or _MISSING,
            "security": _security(c, wildcards),
            "address-settings": _address_settings(c, wildcards),
            "addresses": lambda n, p: _addresses(c, n, p),
        },
    )
    if c.problems:
        raise ConfigError(c.problems)
    return BrokerConfig(source=source, **values)


def parse_config(text: str, *, source: str = "<string>") -> BrokerConfig:
    """Parse and check a YAML config.

    Raises:
        ConfigError: every problem found, each with file, line and key path.
    """
    try:
        if (problem := _depth_problem(text, source)) is not None:
            raise ConfigError([problem])
        root = yaml.compose(text, Loader=CoreSchemaLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        reason = getattr(e, "problem", None) or str(e)
        if context := getattr(e, "context", None):
            reason += f" ({context})"
        if "'\\t'" in reason:  # PyYAML's own words do not say what to do (user pass)
            reason += ": indent with spaces, YAML does not take tabs there"
        problem = ConfigProblem(source, line, "(yaml)", f"not valid YAML: {reason}")
        raise ConfigError([problem]) from None
    if root is not None and (problem := _expansion_problem(root, source)) is not None:
        raise ConfigError([problem])
    return check_tree(root, source=source)


def _tag_problems(root: yaml.Node, source: str) -> list[ConfigProblem]:
    """Nodes the checker could not read: a tag the core schema has no constructor for
    (`!foo`, `!!python/object:...`), or a scalar its explicit tag cannot construct
    (`!!int abc`, `!!bool maybe`, `!!timestamp x`). Construction raised ConstructorError,
    ValueError, KeyError or AttributeError out of the loader (issue 15 attack)."""
    constructor = CoreSchemaLoader("")
    problems = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag == _MERGE_TAG:  # a `<<` key: the checker applies merges itself
            continue
        if node.tag not in CoreSchemaLoader.yaml_constructors:
            message = f"the YAML tag {node.tag!r} is not supported"
        elif isinstance(node, yaml.ScalarNode):
            try:
                constructor.construct_object(node, deep=True)
                continue
            except (yaml.YAMLError, ValueError, KeyError, TypeError, AttributeError):
                message = f"{str(node.value)[:100]!r} is not a valid {node.tag!r} value"
        elif isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in node.value for n in pair)
            continue
        else:
            stack.extend(node.value)
            continue
        problems.append(ConfigProblem(source, node.start_mark.line + 1, "(yaml)", message))
    return problems


def _depth_problem(text: str, source: str) -> ConfigProblem | None:
    """A collection nested past `MAX_YAML_DEPTH`, found from the parser's events (flat,
    unlike composing) before the file is composed."""
    depth = 0
    for event in yaml.parse(text, Loader=CoreSchemaLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                message = f"nested more than {MAX_YAML_DEPTH} deep"
                return ConfigProblem(source, line, "(yaml)", message)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _expansion_problem(root: yaml.Node, source: str) -> ConfigProblem | None:
    """Aliases and merge keys that make the checker walk more than `MAX_ALIAS_EXPANSION`
    nodes per node written (a "billion laughs"). Each node's expanded size is counted
    once (a node met again while counted, a recursive alias, counts one)."""
    sizes: dict[int, int] = {}
    written = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, counted = stack.pop()
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        if counted:
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for child in children)
        elif id(node) not in sizes:
            sizes[id(node)] = 1  # while its children are counted
            written += 1
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    expanded = sizes[id(root)]
    if expanded <= max(_FREE_EXPANSION, MAX_ALIAS_EXPANSION * written):
        return None
    message = (
        f"aliases and merge keys expand {written} nodes to {expanded} "
        f"(at most {MAX_ALIAS_EXPANSION} times the nodes written)"
    )
    return ConfigProblem(source, root.start_mark.line + 1, "(yaml)", message)


def default_config_path() -> Path:
    """The embedded default config (shipped as `amqpbroker/config/default.yaml`)."""
    return Path(__file__).with_name("default.yaml")
