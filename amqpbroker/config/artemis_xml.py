"""An ActiveMQ Artemis `broker.xml`, read into the same checks as the YAML file.

The XML is turned into the node tree a YAML file of the same meaning would compose to
(same keys, XML line numbers), and `load.check_tree` checks it, so both formats give the
same messages. What is read:

* `core/name`, `persistence-enabled`, `journal-datasync` (-> persistence.sync),
  `persist-delivery-count-before-delivery`, `message-expiry-scan-period`,
  `address-queue-scan-period`, `max-redelivery-records`, `id-cache-size`,
  `max-disk-usage`, `disk-scan-period`, `security-enabled`, `wild-card-routing-enabled`
  and `wildcard-addresses`;
* `acceptors/acceptor`: `tcp://HOST:PORT?params` (port 61616 when absent, as Artemis)
  with the parameters `protocols` (must include AMQP, and only AMQP is served),
  `anycastPrefix`, `multicastPrefix`, `amqpTreatRejectAsUnmodifiedDeliveryFailed`,
  `amqpDuplicateDetection`, and TLS through `sslEnabled` with PEM key and trust stores
  (`keyStorePath` holding certificate and key, `trustStorePath`, `needClientAuth`,
  `wantClientAuth`);
* `security-settings/security-setting/permission` (camelCase types become the kebab-case
  permission names, roles are comma-separated);
* `address-settings/address-setting` (every setting of B-103, under its Artemis element
  name; `*-bytes` values take Artemis's K/M/G suffixes, powers of 1024);
* `addresses/address` with `anycast`/`multicast` queues (`durable`, `filter`, and the
  queue attributes amqpbroker has).

Everything else is reported as a problem naming its line, as an unknown YAML key would be:
the broker does not start on a file it would only partly honour. Users cannot be read from
broker.xml (Artemis keeps them in JAAS login modules), so `security-enabled` true is
refused with a pointer to the YAML format. A DOCTYPE (entity declarations) is refused.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit
from xml.parsers import expat

import yaml

from amqpbroker.config.load import (
    SETTING_TABLE,
    ConfigError,
    ConfigProblem,
    CoreSchemaLoader,
    check_tree,
    is_size_key,
    join_path,
    text_bytes,
)
from amqpbroker.config.schema import BrokerConfig
from amqpbroker.core import RoutingType

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
# core element -> (key path in the YAML file, expected kind)
_CORE_SCALARS: dict[str, tuple[tuple[str, ...], type]] = {
    "name": (("name",), str),
    "persistence-enabled": (("persistence", "enabled"), bool),
    "journal-datasync": (("persistence", "sync"), bool),
    "persist-delivery-count-before-delivery": (
        ("persistence", "persist-delivery-count-before-delivery"),
        bool,
    ),
    "message-expiry-scan-period": (("message-expiry-scan-period",), int),
    "address-queue-scan-period": (("address-queue-scan-period",), int),
    "max-redelivery-records": (("max-redelivery-records",), int),
    "id-cache-size": (("id-cache-size",), int),
    "global-max-size": (("global-max-size",), int),
    "max-disk-usage": (("max-disk-usage",), int),
    "disk-scan-period": (("disk-scan-period",), int),
    "security-enabled": (("security", "enabled"), bool),
    "wild-card-routing-enabled": (("wildcard-addresses", "enabled"), bool),
}
_WILDCARD_ELEMENTS = {"enabled": "enabled", "routing-enabled": "enabled"} | {
    k: k for k in ("delimiter", "any-words", "single-word")
}
_QUEUE_ATTRIBUTES: dict[str, type] = {
    "max-consumers": int,
    "purge-on-no-consumers": bool,
    "exclusive": bool,
    "group-rebalance": bool,
    "group-rebalance-pause-dispatch": bool,
    "group-buckets": int,
    "group-first-key": str,
    "consumers-before-dispatch": int,
    "delay-before-dispatch": int,
    "last-value": bool,
    "last-value-key": str,
    "non-destructive": bool,
    "ring-size": int,
}
_ACCEPTOR_PARAMETERS: dict[str, tuple[str, type]] = {
    "anycastPrefix": ("anycast-prefix", str),
    "multicastPrefix": ("multicast-prefix", str),
    "amqpTreatRejectAsUnmodifiedDeliveryFailed": (
        "amqp-treat-reject-as-unmodified-delivery-failed",
        bool,
    ),
    "amqpDuplicateDetection": ("amqp-duplicate-detection", bool),
    "handshake-timeout": ("handshake-timeout", int),
    "amqpIdleTimeout": ("amqp-idle-timeout", int),
    "connectionsAllowed": ("connections-allowed", int),
}
_TLS_PARAMETERS = (
    "sslEnabled",
    "keyStorePath",
    "keyStoreType",
    "trustStorePath",
    "trustStoreType",
    "needClientAuth",
    "wantClientAuth",
)
_ARTEMIS_DEFAULT_PORT = 61616


@dataclass
class _Element:
    """An XML element with the line it starts on (ElementTree does not keep lines)."""

    tag: str  # local name, namespace dropped
    attributes: dict[str, str]
    line: int
    column: int
    children: list[_Element] = field(default_factory=list)
    text: str = ""
    # expat hands text over in pieces (one a line): joined once at the end tag, since
    # `text += piece` copied the whole text each time (800 KB of lines took 19 s)
    parts: list[str] = field(default_factory=list)


def _parse(text: str, source: str) -> _Element:
    """Parse with expat (namespace-aware; line numbers); refuse DOCTYPEs."""
    parser = expat.ParserCreate(namespace_separator=" ")
    stack: list[_Element] = []
    roots: list[_Element] = []

    def start(name: str, attributes: dict[str, str]) -> None:
        element = _Element(
            tag=name.rpartition(" ")[2],
            # Namespaced attributes (xsi:schemaLocation) are for schema tools.
            attributes={k: v for k, v in attributes.items() if " " not in k},
            line=parser.CurrentLineNumber,
            column=parser.CurrentColumnNumber,
        )
        (stack[-1].children if stack else roots).append(element)
        stack.append(element)

    def end(name: str) -> None:
        element = stack.pop()
        element.text = "".join(element.parts).strip()
        element.parts = []

    def characters(data: str) -> None:
        if stack:
            stack[-1].parts.append(data)

    def doctype(*args: Any) -> None:
        raise _Refused(parser.CurrentLineNumber, "a DOCTYPE is not supported in broker.xml")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = characters
    parser.StartDoctypeDeclHandler = doctype
    try:
        parser.Parse(text, True)
    except expat.ExpatError as e:
        message = f"not valid XML: {expat.ErrorString(e.code)}"
        raise ConfigError([ConfigProblem(source, e.lineno, "(xml)", message)]) from None
    except _Refused as e:
        raise ConfigError([ConfigProblem(source, e.line, "(xml)", e.message)]) from None
    return roots[0]


class _Refused(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Builder:
    """Builds YAML nodes from elements, reporting what has no place in the schema."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[ConfigProblem] = []

    def problem(self, element: _Element, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(self.source, element.line, path, message))

    def unsupported(self, element: _Element, path: str, supported: Iterable[str]) -> None:
        hint = difflib.get_close_matches(element.tag, list(supported), n=1, cutoff=0.85)
        suffix = f" (did you mean '{hint[0]}'?)" if hint else ""
        self.problem(element, path, f"<{element.tag}> is not supported by amqpbroker{suffix}")

    def mark(self, element: _Element) -> yaml.Mark:
        return yaml.Mark(self.source, 0, element.line - 1, element.column, "", 0)

    def scalar(self, value: str, element: _Element, path: str, kind: type) -> yaml.ScalarNode:
        """`value` as YAML would type it; always a string where a string is expected."""
        if "${" in value:
            self.problem(element, path, f"${{...}} substitution is not supported: {value!r}")
        tag = _STR
        if kind is not str and value:
            resolvers = CoreSchemaLoader.yaml_implicit_resolvers.get(value[0], [])
            tag = next((t for t, regexp in resolvers if regexp.match(value)), _STR)
        mark = self.mark(element)
        return yaml.ScalarNode(tag, value, mark, mark)

    def text(
        self, element: _Element, path: str, kind: type, value: str | None = None
    ) -> yaml.ScalarNode:
        """The element's text (or `value` made from it) as a scalar; it has no children."""
        for child in element.children:
            self.problem(child, path, f"<{element.tag}> holds a value, not <{child.tag}>")
        return self.scalar(element.text if value is None else value, element, path, kind)

    def mapping(self, pairs: list[tuple[str, yaml.Node]], element: _Element) -> yaml.MappingNode:
        mark = self.mark(element)
        keys = [(yaml.ScalarNode(_STR, k, v.start_mark, v.start_mark), v) for k, v in pairs]
        return yaml.MappingNode(_MAP, keys, mark, mark)

    def sequence(self, items: list[yaml.Node], element: _Element) -> yaml.SequenceNode:
        mark = self.mark(element)
        return yaml.SequenceNode(_SEQ, items, mark, mark)

    def attributes(self, element: _Element, path: str, known: Iterable[str]) -> dict[str, str]:
        known = set(known)
        for name in element.attributes:
            if name not in known:
                message = f"attribute {name!r} of <{element.tag}> is not supported by amqpbroker"
                self.problem(element, path, message)
        return {k: v for k, v in element.attributes.items() if k in known}

    def required(self, element: _Element, path: str, name: str) -> str | None:
        value = element.attributes.get(name)
        if value is None:
            self.problem(element, path, f"<{element.tag}> needs a {name!r} attribute")
        return value


class _Tree:
    """Nested keys -> nodes, turned into mapping nodes at the end (first element's line)."""

    def __init__(self, element: _Element) -> None:
        self.element = element
        self.items: dict[str, yaml.Node | _Tree] = {}

    def put(self, b: _Builder, path: tuple[str, ...], node: yaml.Node, element: _Element) -> None:
        tree = self
        for key in path[:-1]:
            sub = tree.items.setdefault(key, _Tree(element))
            assert isinstance(sub, _Tree)
            tree = sub
        if path[-1] in tree.items:
            b.problem(element, ".".join(path), f"<{element.tag}> is given more than once")
            return
        tree.items[path[-1]] = node

    def node(self, b: _Builder) -> yaml.MappingNode:
        pairs = [(k, v.node(b) if isinstance(v, _Tree) else v) for k, v in self.items.items()]
        return b.mapping(pairs, self.element)


def parse_artemis_xml(text: str, *, source: str = "<string>") -> BrokerConfig:
    """Read an Artemis broker.xml into a `BrokerConfig` (see the module docstring).

    Raises:
        ConfigError: every problem found, unsupported elements included.
    """
    root = _parse(text, source)
    b = _Builder(source)
    if root.tag != "configuration":
        b.problem(root, "(xml)", f"expected <configuration> as the root, not <{root.tag}>")
        raise ConfigError(b.problems)
    cores = [child for child in root.children if child.tag == "core"]
    for child in root.children:
        if child.tag != "core":
            b.unsupported(child, child.tag, ("core",))
    if len(cores) != 1:
        b.problem(root, "core", "expected exactly one <core> element")
        raise ConfigError(b.problems)
    tree = _core(b, cores[0])
    yaml_root = tree.node(b)
    try:
        config = check_tree(yaml_root, source=source)
    except ConfigError as e:
        raise ConfigError(b.problems + e.problems) from None
    if b.problems:
        raise ConfigError(b.problems)
    return config


def _bytes_text(element: _Element) -> str:
    """A size element's text in bytes ("10MiB" -> "10485760", Artemis ByteUtil); other
    elements' text as it is."""
    text = element.text
    if is_size_key(element.tag) and (size := text_bytes(text)) is not None:
        return str(size)
    return text


def _core(b: _Builder, core: _Element) -> _Tree:
    tree = _Tree(core)
    b.attributes(core, "core", ())
    sections: dict[str, tuple[tuple[str, ...], Callable[[_Builder, _Element], yaml.Node]]] = {
        "acceptors": (("acceptors",), _acceptors),
        "security-settings": (("security", "security-settings"), _security_settings),
        "address-settings": (("address-settings",), _address_settings),
        "addresses": (("addresses",), _addresses),
    }
    supported = [*_CORE_SCALARS, *sections, "wildcard-addresses"]
    for child in core.children:
        if child.tag in _CORE_SCALARS:
            keys, kind = _CORE_SCALARS[child.tag]
            tree.put(b, keys, b.text(child, ".".join(keys), kind, _bytes_text(child)), child)
            if child.tag == "security-enabled" and child.text.lower() == "true":
                b.problem(
                    child,
                    "security.enabled",
                    "users are not read from broker.xml (Artemis keeps them in JAAS login "
                    "modules): write this config as YAML (security.users) to enable security",
                )
        elif child.tag in sections:
            keys, build = sections[child.tag]
            tree.put(b, keys, build(b, child), child)
        elif child.tag == "wildcard-addresses":
            for item in child.children:
                key = _WILDCARD_ELEMENTS.get(item.tag)
                item_path = join_path("wildcard-addresses", item.tag)
                if key is None:
                    b.unsupported(item, item_path, _WILDCARD_ELEMENTS)
                    continue
                kind = bool if key == "enabled" else str
                tree.put(b, ("wildcard-addresses", key), b.text(item, item_path, kind), item)
        else:
            b.unsupported(child, join_path("core", child.tag), supported)
    return tree


def _children(b: _Builder, element: _Element, path: str, tag: str) -> list[_Element]:
    """The `tag` children of a list element; anything else is reported."""
    for child in element.children:
        if child.tag != tag:
            b.unsupported(child, path, (tag,))
    return [child for child in element.children if child.tag == tag]


def _acceptors(b: _Builder, element: _Element) -> yaml.Node:
    items: list[yaml.Node] = []
    for child in _children(b, element, "acceptors", "acceptor"):
        path = f"acceptors[{len(items)}]"
        b.attributes(child, path, ("name",))
        name = b.required(child, path, "name")
        pairs: list[tuple[str, yaml.Node]] = []
        if name is not None:
            pairs.append(("name", b.scalar(name, child, path, str)))
        pairs += _acceptor_url(b, child, path)
        items.append(b.mapping(pairs, child))
    return b.sequence(items, element)


def _acceptor_url(b: _Builder, element: _Element, path: str) -> list[tuple[str, yaml.Node]]:
    """tcp://HOST:PORT?k=v;k=v as the url, tls and option keys of a YAML acceptor."""
    url_path = join_path(path, "url")
    url = element.text
    if "${" in url:
        b.problem(element, url_path, f"${{...}} substitution is not supported: {url!r}")
        return []
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "tcp" or not parts.hostname or port == -1:
        b.problem(element, url_path, f"expected tcp://HOST:PORT?PARAMETERS: {url!r}")
        return []
    params: dict[str, str] = {}
    for item in re.split(r"[;&]", parts.query):
        if item:
            key, _, value = item.partition("=")
            params[key] = value
    protocols = [p.strip().upper() for p in params.pop("protocols", "AMQP").split(",")]
    if "AMQP" not in protocols:
        b.problem(element, url_path, f"serves no AMQP (protocols={','.join(protocols)})")
    elif others := [p for p in protocols if p != "AMQP"]:
        b.problem(element, url_path, f"only AMQP is served; not supported: {', '.join(others)}")
    tls = {k: params.pop(k) for k in _TLS_PARAMETERS if k in params}
    secure = tls.get("sslEnabled", "false").lower() == "true"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    scheme = "amqps" if secure else "amqp"
    pairs: list[tuple[str, yaml.Node]] = [
        (
            "url",
            b.scalar(
                f"{scheme}://{host}:{_ARTEMIS_DEFAULT_PORT if port is None else port}",
                element,
                path,
                str,
            ),
        )
    ]
    for key, value in params.items():
        if key not in _ACCEPTOR_PARAMETERS:
            b.problem(
                element,
                url_path,
                f"acceptor parameter {key!r} is not supported by amqpbroker",
            )
            continue
        name, kind = _ACCEPTOR_PARAMETERS[key]
        pairs.append((name, b.scalar(value, element, join_path(path, name), kind)))
    if secure:
        pairs.append(("tls", _tls(b, element, join_path(path, "tls"), tls)))
    elif len(tls) > ("sslEnabled" in tls):
        b.problem(element, url_path, "TLS parameters without sslEnabled=true")
    return pairs


def _tls(b: _Builder, element: _Element, path: str, params: dict[str, str]) -> yaml.Node:
    for store in ("keyStore", "trustStore"):
        kind = params.get(f"{store}Type", "JKS")  # the Artemis default
        if f"{store}Path" in params and kind.upper() != "PEM":
            b.problem(element, path, f"{store}Type={kind}: only PEM stores are read")
    pairs: list[tuple[str, yaml.Node]] = []
    if "keyStorePath" in params:  # a PEM key store holds the certificate chain and the key
        key_store = b.scalar(params["keyStorePath"], element, path, str)
        pairs += [("cert-file", key_store), ("key-file", key_store)]
    if "trustStorePath" in params:
        pairs.append(("ca-file", b.scalar(params["trustStorePath"], element, path, str)))
    if params.get("needClientAuth", "").lower() == "true":
        pairs.append(("client-auth", b.scalar("required", element, path, str)))
    elif params.get("wantClientAuth", "").lower() == "true":
        pairs.append(("client-auth", b.scalar("optional", element, path, str)))
    return b.mapping(pairs, element)


def _kebab(name: str) -> str:
    """createNonDurableQueue -> create-non-durable-queue (Artemis permission types)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def _security_settings(b: _Builder, element: _Element) -> yaml.Node:
    pairs: list[tuple[str, yaml.Node]] = []
    for setting in _children(b, element, "security-settings", "security-setting"):
        b.attributes(setting, "security-settings", ("match",))
        match = b.required(setting, "security-settings", "match")
        if match is None:
            continue
        path = join_path("security.security-settings", match)
        permissions: list[tuple[str, yaml.Node]] = []
        for permission in _children(b, setting, path, "permission"):
            b.attributes(permission, path, ("type", "roles"))
            kind = b.required(permission, path, "type")
            roles = b.required(permission, path, "roles")
            if kind is None or roles is None:
                continue
            names = [r.strip() for r in roles.split(",") if r.strip()]
            role_path = join_path(path, _kebab(kind))
            items: list[yaml.Node] = [b.scalar(r, permission, role_path, str) for r in names]
            permissions.append((_kebab(kind), b.sequence(items, permission)))
        pairs.append((match, b.mapping(permissions, setting)))
    return b.mapping(pairs, element)


def _address_settings(b: _Builder, element: _Element) -> yaml.Node:
    supported = {name.replace("_", "-"): name for name in SETTING_TABLE}
    pairs: list[tuple[str, yaml.Node]] = []
    for setting in _children(b, element, "address-settings", "address-setting"):
        b.attributes(setting, "address-settings", ("match",))
        match = b.required(setting, "address-settings", "match")
        if match is None:
            continue
        path = join_path("address-settings", match)
        values: list[tuple[str, yaml.Node]] = []
        for child in setting.children:
            key_path = join_path(path, child.tag)
            if child.tag not in supported:
                b.unsupported(child, key_path, supported)
                continue
            kind = SETTING_TABLE[supported[child.tag]][0]
            text = _bytes_text(child)
            if kind is RoutingType:
                kind = str
            values.append((child.tag, b.text(child, key_path, kind, text)))
        pairs.append((match, b.mapping(values, setting)))
    return b.mapping(pairs, element)


def _addresses(b: _Builder, element: _Element) -> yaml.Node:
    items: list[yaml.Node] = []
    for address in _children(b, element, "addresses", "address"):
        path = f"addresses[{len(items)}]"
        b.attributes(address, path, ("name",))
        name = b.required(address, path, "name")
        pairs: list[tuple[str, yaml.Node]] = []
        if name is not None:
            pairs.append(("name", b.scalar(name, address, path, str)))
        for routing in address.children:
            if routing.tag not in ("anycast", "multicast"):
                b.unsupported(routing, path, ("anycast", "multicast"))
                continue
            routing_path = join_path(path, routing.tag)
            queues = [
                _queue(b, queue, f"{routing_path}[{i}]")
                for i, queue in enumerate(_children(b, routing, routing_path, "queue"))
            ]
            pairs.append((routing.tag, b.sequence(queues, routing)))
        items.append(b.mapping(pairs, address))
    return b.sequence(items, element)


def _queue(b: _Builder, queue: _Element, path: str) -> yaml.Node:
    b.attributes(queue, path, ("name", *_QUEUE_ATTRIBUTES))
    name = b.required(queue, path, "name")
    pairs: list[tuple[str, yaml.Node]] = []
    if name is not None:
        pairs.append(("name", b.scalar(name, queue, path, str)))
    for key, kind in _QUEUE_ATTRIBUTES.items():
        if key in queue.attributes:
            pairs.append((key, b.scalar(queue.attributes[key], queue, join_path(path, key), kind)))
    for child in queue.children:
        if child.tag == "durable":
            pairs.append(("durable", b.text(child, join_path(path, "durable"), bool)))
        elif child.tag == "filter":
            b.attributes(child, join_path(path, "filter"), ("string",))
            selector = b.required(child, join_path(path, "filter"), "string")
            if selector is not None:
                pairs.append(("filter", b.scalar(selector, child, join_path(path, "filter"), str)))
        else:
            b.unsupported(child, join_path(path, child.tag), ("durable", "filter"))
    return b.mapping(pairs, queue)
