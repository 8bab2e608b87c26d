"""YAML config loading: every problem reported with file, line and key path.

The file is composed into YAML nodes (which keep their line numbers) and checked key by
key against the tables below. Nothing stops at the first problem: all of them are
collected into one `ConfigError`, one line each, in the form

    config/broker.yaml:12: acceptors[0].tsl: unknown key (did you mean 'tls'?)

A config with any problem is never used: the broker does not start on a config it does
not understand.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable, Mapping
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
from amqpbroker.core import AddressSettings, ResolvedSettings, RoutingType, WildcardConfig
from amqpbroker.core.security import PERMISSIONS
from amqpbroker.core.settings import (
    ADDRESS_FULL_POLICIES,
    CONFIG_DELETE_POLICIES,
    SLOW_CONSUMER_POLICIES,
)

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ENUMS: dict[str, tuple[str, ...]] = {
    "address_full_policy": ADDRESS_FULL_POLICIES,
    "slow_consumer_policy": SLOW_CONSUMER_POLICIES,
    "config_delete_queues": CONFIG_DELETE_POLICIES,
    "config_delete_addresses": CONFIG_DELETE_POLICIES,
}
_MISSING = object()


class ConfigProblem(NamedTuple):
    """One problem: where it is and what is wrong."""

    source: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.path}: {self.message}"


class ConfigError(Exception):
    """Every problem found in a config file, one line each."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def _join(path: str, key: str) -> str:
    shown = key if _PLAIN_KEY.match(key) else f'"{key}"'
    return f"{path}.{shown}" if path else shown


class _Checker:
    """Walks YAML nodes, converting values and collecting problems."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[ConfigProblem] = []
        self._constructor = yaml.SafeLoader("")

    def problem(self, node: yaml.Node, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(self.source, node.start_mark.line + 1, path, message))

    # -- scalars ------------------------------------------------------------------------
    def value(self, node: yaml.Node) -> Any:
        return self._constructor.construct_object(node, deep=True)

    def scalar(self, node: yaml.Node, path: str, kind: type, *, nullable: bool = False) -> Any:
        """A scalar of `kind` (bool is not an int; an int is a float), else _MISSING."""
        if not isinstance(node, yaml.ScalarNode):
            self.problem(
                node,
                path,
                f"expected a {_kind_name(kind)}, not a "
                f"{'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}",
            )
            return _MISSING
        value = self.value(node)
        if value is None:
            if nullable:
                return None
            self.problem(node, path, f"expected a {_kind_name(kind)}, not null")
            return _MISSING
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            self.problem(node, path, f"not {_article(kind)} {_kind_name(kind)}: {value!r}")
            return _MISSING
        return value

    def choice(self, node: yaml.Node, path: str, choices: tuple[str, ...]) -> Any:
        value = self.scalar(node, path, str)
        if value is _MISSING:
            return _MISSING
        if value not in choices:
            self.problem(node, path, f"must be one of {', '.join(choices)}: {value!r}")
            return _MISSING
        return value

    def strings(self, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.SequenceNode):
            self.problem(node, path, "expected a list of strings")
            return _MISSING
        values = [self.scalar(item, f"{path}[{i}]", str) for i, item in enumerate(node.value)]
        return _MISSING if _MISSING in values else tuple(values)

    # -- compounds ----------------------------------------------------------------------
    def mapping(
        self,
        node: yaml.Node,
        path: str,
        handlers: Mapping[str, Callable[[yaml.Node, str], Any]],
        *,
        required: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Check a mapping against `handlers` (kebab key -> converter); return converted
        values by snake_case name for the keys present and valid."""
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, path or "(top level)", "expected a mapping")
            return {}
        out: dict[str, Any] = {}
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = self.value(key_node)
            key_path = _join(path, str(key))
            if not isinstance(key, str):
                self.problem(key_node, key_path, "keys must be strings")
                continue
            if key in seen:
                self.problem(key_node, key_path, "duplicate key")
                continue
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
                self.problem(node, _join(path, key), "required key is missing")
        return out

    def entries(self, node: yaml.Node, path: str) -> list[tuple[yaml.Node, str, yaml.Node]]:
        """(key node, key, value node) of a mapping whose keys are free-form names."""
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, path, "expected a mapping")
            return []
        out = []
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str) or not key:
                self.problem(key_node, path, f"keys must be non-empty strings: {key!r}")
                continue
            out.append((key_node, key, value_node))
        return out

    def items(self, node: yaml.Node, path: str) -> list[tuple[yaml.Node, str]]:
        if not isinstance(node, yaml.SequenceNode):
            self.problem(node, path, "expected a list")
            return []
        return [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]


def _kind_name(kind: type) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        kind, kind.__name__
    )


def _article(kind: type) -> str:
    return "an" if _kind_name(kind)[0] in "aeiou" else "a"


# -- sections ---------------------------------------------------------------------------


def _typed(kind: type, **checks: Callable[[Any], str | None]) -> Callable[[_Checker], Any]:
    def make(c: _Checker) -> Callable[[yaml.Node, str], Any]:
        def convert(node: yaml.Node, path: str) -> Any:
            value = c.scalar(node, path, kind)
            if value is not _MISSING:
                for check in checks.values():
                    problem = check(value)
                    if problem:
                        c.problem(node, path, problem)
                        return _MISSING
            return value

        return convert

    return make


def _at_least(minimum: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= minimum else f"must be >= {minimum}: {v!r}"


def _name_problem(name: str, what: str) -> str | None:
    """B-150 for names in configuration files."""
    if not name:
        return f"{what} name must not be empty"
    if any(ord(ch) < 0x20 for ch in name):
        return f"{what} name {name!r} contains a control character"
    if name.count("::") > 1:
        return f"{what} name {name!r} has more than one '::'"
    return None


def _setting_checks() -> dict[str, tuple[type, Callable[[Any], str | None] | None]]:
    """Kind and range check of every address-setting (B-067, B-103)."""
    hints = typing.get_type_hints(ResolvedSettings)
    table: dict[str, tuple[type, Callable[[Any], str | None] | None]] = {}
    for f in dataclasses.fields(ResolvedSettings):
        kind = hints[f.name]
        if isinstance(kind, types.UnionType):
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        table[f.name] = (kind, None)
    table["redelivery_collision_avoidance_factor"] = (
        float,
        lambda v: None if 0.0 <= v <= 1.0 else f"must be between 0 and 1: {v!r}",
    )
    table["redelivery_delay"] = (int, _at_least(0))
    table["max_redelivery_delay"] = (int, _at_least(0))
    table["redelivery_delay_multiplier"] = (float, _at_least(1.0))
    return table


_SETTINGS = _setting_checks()


def _address_settings(c: _Checker, node: yaml.Node, path: str) -> dict[str, AddressSettings]:
    out: dict[str, AddressSettings] = {}
    wildcards = WildcardConfig()
    for key_node, pattern, value_node in c.entries(node, path):
        entry_path = _join(path, pattern)
        problem = wildcards.validate_pattern(pattern)
        if problem:
            c.problem(key_node, entry_path, problem)
        handlers: dict[str, Callable[[yaml.Node, str], Any]] = {}
        for name, (kind, check) in _SETTINGS.items():
            handlers[name.replace("_", "-")] = _setting_converter(c, name, kind, check)
        values = c.mapping(value_node, entry_path, handlers)
        if not problem:
            out[pattern] = AddressSettings.of(**{k: v for k, v in values.items() if v is not None})
    return out


def _setting_converter(
    c: _Checker, name: str, kind: type, check: Callable[[Any], str | None] | None
) -> Callable[[yaml.Node, str], Any]:
    def convert(node: yaml.Node, path: str) -> Any:
        if kind is RoutingType:
            value = c.choice(node, path, ("ANYCAST", "MULTICAST"))
            return value if value is _MISSING else RoutingType(value)
        if name in _ENUMS:
            return c.choice(node, path, _ENUMS[name])
        value = c.scalar(node, path, kind, nullable=True)  # null: not set here
        if value not in (_MISSING, None) and check is not None and (problem := check(value)):
            c.problem(node, path, problem)
            return _MISSING
        return value

    return convert


def _acceptor(c: _Checker, node: yaml.Node, path: str) -> Any:
    def tls(n: yaml.Node, p: str) -> Any:
        values = c.mapping(
            n,
            p,
            {
                "cert-file": lambda n2, p2: c.scalar(n2, p2, str),
                "key-file": lambda n2, p2: c.scalar(n2, p2, str),
                "ca-file": lambda n2, p2: c.scalar(n2, p2, str, nullable=True),
                "client-auth": lambda n2, p2: c.choice(n2, p2, ("none", "optional", "required")),
            },
            required=("cert-file", "key-file"),
        )
        return TlsConfig(**values) if {"cert_file", "key_file"} <= values.keys() else _MISSING

    values = c.mapping(
        node,
        path,
        {
            "name": lambda n, p: c.scalar(n, p, str),
            "url": lambda n, p: c.scalar(n, p, str),
            "anycast-prefix": lambda n, p: c.scalar(n, p, str, nullable=True),
            "multicast-prefix": lambda n, p: c.scalar(n, p, str, nullable=True),
            "tls": tls,
            "amqp-treat-reject-as-unmodified-delivery-failed": lambda n, p: c.scalar(n, p, bool),
            "amqp-duplicate-detection": lambda n, p: c.scalar(n, p, bool),
        },
        required=("name", "url"),
    )
    if "name" not in values or "url" not in values:
        return _MISSING
    url_node = next(v for k, v in node.value if c.value(k) == "url")
    parts = urlsplit(values["url"])
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname or port is None or port < 0:
        c.problem(
            url_node,
            _join(path, "url"),
            f"expected amqp://HOST:PORT or amqps://HOST:PORT (port 0-65535): {values['url']!r}",
        )
        return _MISSING
    if parts.scheme == "amqps" and "tls" not in values:
        c.problem(url_node, _join(path, "url"), "an amqps:// acceptor needs a tls: section")
        return _MISSING
    return AcceptorConfig(scheme=parts.scheme, host=parts.hostname, port=port, **values)


def _queue(c: _Checker, node: yaml.Node, path: str) -> Any:
    values = c.mapping(
        node,
        path,
        {
            "name": lambda n, p: c.scalar(n, p, str),
            "durable": lambda n, p: c.scalar(n, p, bool),
            "filter": lambda n, p: c.scalar(n, p, str, nullable=True),
            "max-consumers": lambda n, p: c.scalar(n, p, int),
            "purge-on-no-consumers": lambda n, p: c.scalar(n, p, bool),
            "exclusive": lambda n, p: c.scalar(n, p, bool),
            "last-value-key": lambda n, p: c.scalar(n, p, str, nullable=True),
            "last-value": lambda n, p: c.scalar(n, p, bool),
            "non-destructive": lambda n, p: c.scalar(n, p, bool),
            "ring-size": lambda n, p: c.scalar(n, p, int),
        },
        required=("name",),
    )
    if "name" not in values:
        return _MISSING
    if problem := _name_problem(values["name"], "queue"):
        c.problem(node, _join(path, "name"), problem)
        return _MISSING
    if values.get("filter"):
        from amqpbroker.core import InvalidSelector
        from amqpbroker.core.selector import parse_selector

        try:
            parse_selector(values["filter"])
        except InvalidSelector as e:
            c.problem(node, _join(path, "filter"), f"invalid filter: {e}")
            return _MISSING
    return QueueDef(**values)


def _address(c: _Checker, node: yaml.Node, path: str) -> Any:
    def queues(n: yaml.Node, p: str) -> Any:
        if isinstance(n, yaml.ScalarNode) and c.value(n) is None:
            return ()
        found = [_queue(c, item, item_path) for item, item_path in c.items(n, p)]
        return tuple(q for q in found if q is not _MISSING)

    values = c.mapping(
        node,
        path,
        {
            "name": lambda n, p: c.scalar(n, p, str),
            "anycast": queues,
            "multicast": queues,
        },
        required=("name",),
    )
    if "name" not in values:
        return _MISSING
    if problem := _name_problem(values["name"], "address"):
        c.problem(node, _join(path, "name"), problem)
        return _MISSING
    present = frozenset(k.upper() for k in ("anycast", "multicast") if k in values)
    return AddressConfig(routing_types=present, **values)


def _section(
    c: _Checker, cls: type, table: dict[str, Callable[[yaml.Node, str], Any]]
) -> Callable[[yaml.Node, str], Any]:
    return lambda node, path: cls(**c.mapping(node, path, table))


def _build(c: _Checker, root: yaml.Node) -> dict[str, Any]:
    def s(kind: type, **kw: Any) -> Callable[[yaml.Node, str], Any]:
        return lambda n, p: c.scalar(n, p, kind, **kw)

    def non_negative_or_minus_one(n: yaml.Node, p: str) -> Any:
        value = c.scalar(n, p, int)
        if value is not _MISSING and value < -1:
            c.problem(n, p, f"must be -1 (off) or >= 0: {value!r}")
            return _MISSING
        return value

    def http(n: yaml.Node, p: str) -> Any:
        values = c.mapping(n, p, {"bind": s(str), "enabled": s(bool)})
        bind = values.pop("bind", None)
        if bind is not None:
            host, _, port_text = bind.rpartition(":")
            if not host or not port_text.isdigit() or int(port_text) > 65535:
                c.problem(n, _join(p, "bind"), f"expected HOST:PORT (port 0-65535): {bind!r}")
                return _MISSING
            values.update(host=host, port=int(port_text))
        return HttpConfig(**values)

    def acceptors(n: yaml.Node, p: str) -> Any:
        found = [_acceptor(c, item, ip) for item, ip in c.items(n, p)]
        good = tuple(a for a in found if a is not _MISSING)
        names = [a.name for a in good]
        for name in {x for x in names if names.count(x) > 1}:
            c.problem(n, p, f"acceptor name {name!r} is used more than once")
        return good

    def addresses(n: yaml.Node, p: str) -> Any:
        found = [_address(c, item, ip) for item, ip in c.items(n, p)]
        return tuple(a for a in found if a is not _MISSING)

    def wildcards(n: yaml.Node, p: str) -> Any:
        values = c.mapping(
            n,
            p,
            {"enabled": s(bool), "delimiter": s(str), "any-words": s(str), "single-word": s(str)},
        )
        return WildcardConfig(**values)

    def users(n: yaml.Node, p: str) -> Any:
        out = {}
        for _, name, value in c.entries(n, p):
            values = c.mapping(
                value,
                _join(p, name),
                {"password-hash": s(str), "roles": c.strings},
                required=("password-hash",),
            )
            if "password_hash" in values:
                out[name] = UserConfig(**values)
        return out

    def security_settings(n: yaml.Node, p: str) -> Any:
        out = {}
        for _, pattern, value in c.entries(n, p):
            table = {perm: c.strings for perm in sorted(PERMISSIONS)}
            out[pattern] = c.mapping(value, _join(p, pattern), table)
        return {
            k: {perm.replace("_", "-"): v for perm, v in vals.items()} for k, vals in out.items()
        }

    return c.mapping(
        root,
        "",
        {
            "name": s(str),
            "data-dir": s(str, nullable=True),
            "acceptors": acceptors,
            "http": http,
            "persistence": _section(
                c,
                PersistenceConfig,
                {
                    "enabled": s(bool),
                    "sync": s(bool),
                    "persist-delivery-count-before-delivery": s(bool),
                },
            ),
            "message-expiry-scan-period": non_negative_or_minus_one,
            "address-queue-scan-period": non_negative_or_minus_one,
            "max-redelivery-records": s(int),
            "id-cache-size": s(int),
            "event-log": _section(
                c,
                EventLogConfig,
                {
                    "enabled": s(bool),
                    "level": lambda n, p: c.choice(n, p, ("off", "failures", "lifecycle")),
                    "properties": c.strings,
                    "body-hash": s(bool),
                    "max-file-bytes": s(int),
                    "max-file-age": s(int),
                },
            ),
            "metrics": _section(c, MetricsConfig, {"artemis-names": s(bool)}),
            "wildcard-addresses": wildcards,
            "security": _section(
                c,
                SecurityConfig,
                {
                    "enabled": s(bool),
                    "sasl-mechanisms": c.strings,
                    "allow-plain-without-tls": s(bool),
                    "users": users,
                    "security-settings": security_settings,
                },
            ),
            "address-settings": lambda n, p: _address_settings(c, n, p),
            "addresses": addresses,
        },
    )


def _check_queue_names(c: _Checker, root: yaml.Node, addresses: tuple[AddressConfig, ...]) -> None:
    """B-001: queue names are unique across the whole broker."""
    seen: set[str] = set()
    for address in addresses:
        for queue in (*address.anycast, *address.multicast):
            if queue.name in seen:
                c.problem(root, "addresses", f"queue name {queue.name!r} is used more than once")
            seen.add(queue.name)


def parse_config(text: str, *, source: str = "<string>") -> BrokerConfig:
    """Parse and check a YAML config.

    Raises:
        ConfigError: every problem found, each with file, line and key path.
    """
    checker = _Checker(source)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        reason = getattr(e, "problem", None) or str(e)
        raise ConfigError(
            [ConfigProblem(source, line, "(yaml)", f"not valid YAML: {reason}")]
        ) from None
    if root is None:
        return BrokerConfig(source=source)
    values = _build(checker, root)
    if "addresses" in values:
        _check_queue_names(checker, root, values["addresses"])
    if "wildcard_addresses" in values and "address_settings" in values:
        wildcards = values["wildcard_addresses"]
        for pattern in values["address_settings"]:
            if problem := wildcards.validate_pattern(pattern):
                checker.problems.append(
                    ConfigProblem(source, 1, "address-settings", f"{pattern!r}: {problem}")
                )
    if checker.problems:
        raise ConfigError(checker.problems)
    return BrokerConfig(source=source, **values)


def load_config(path: Path | str) -> BrokerConfig:
    """Read and check a config file.

    Raises:
        ConfigError: the file has problems (all of them are listed).
        OSError: the file cannot be read.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".xml":
        raise ConfigError(
            [
                ConfigProblem(
                    str(path),
                    1,
                    "(file)",
                    "Artemis broker.xml is not supported by this version; write the same settings "
                    "as YAML (same key names, see config/broker.yaml)",
                )
            ]
        )
    return parse_config(text, source=str(path))


def default_config_path() -> Path:
    """The embedded default config (shipped as `amqpbroker/config/default.yaml`)."""
    return Path(__file__).with_name("default.yaml")
