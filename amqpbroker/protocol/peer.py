"""Values the peer sent, read safely out of Proton's decoded data (issue 15).

Proton decodes every frame field into a `pn_data_t` tree without checking that a list,
map or array holds as many elements as its header claims: `e0 08 09 a3 05 queue` (an
array of 9 symbols holding one) becomes a tree that crashes the engine (SIGSEGV) when it
is encoded again, e.g. after `Terminus.copy`. So the broker never hands peer data back to
the engine: it reads it here, where every node is checked (declared count = children
found, one element type per array, known types only, nesting bounded by
`sections.MAX_DEPTH`), and builds its own termini from the checked values.

Three refusals, each naming the field:
* `PeerDecodeError` (`amqp:decode-error`): the value is not a well-formed AMQP value;
* `PeerInvalidField` (`amqp:invalid-field`): well-formed, but of a type the field
  cannot have (capabilities that are a `uint`, a filter that is a list, ...);
* `PeerValueTooLarge` (`amqp:resource-limit-exceeded`): more than `MAX_VALUE_NODES`
  values in one field. Size in bytes does not bound a tree: an array of 65,000 nulls is
  10 bytes on the wire, 5 MB of Proton nodes, and walking it here took 0.15 s of CPU
  (issue 15 attack, B-153).
Link fields refuse the link; connection fields close the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from cproton_ffi import ffi, lib
from proton import UNDESCRIBED, Array, Data, Described, Link, symbol

from amqpbroker.amqp.sections import MAX_DEPTH
from amqpbroker.core import ClientError

T = TypeVar("T")

__all__ = [
    "MAX_VALUE_NODES",
    "PeerDecodeError",
    "PeerInvalidField",
    "PeerValueTooLarge",
    "count_nodes",
    "data_at",
    "name_for_log",
    "read_data",
    "read_filter_set",
    "read_link_name",
    "read_symbol_map",
    "read_symbols",
    "read_text",
]


class PeerDecodeError(ClientError):
    """A field the peer sent is not a well-formed AMQP value."""

    condition: ClassVar[str] = "amqp:decode-error"

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


class PeerInvalidField(ClientError):
    """A field the peer sent is well-formed but has a type or value it cannot have."""

    condition: ClassVar[str] = "amqp:invalid-field"

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


class PeerValueTooLarge(ClientError):
    """A field the peer sent holds more values than the broker reads (`MAX_VALUE_NODES`)."""

    condition: ClassVar[str] = "amqp:resource-limit-exceeded"

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


# The values (nodes: each scalar, list, map, array, described and descriptor) one field,
# or all the fields of one attach together (`attach.attach_bytes`), may hold. Clients send
# tens (capabilities, outcomes, a selector, a few properties); the walk costs ~1-3 us a
# node and Proton keeps ~80 bytes a node while the link lives (issue 15 attack, B-153).
MAX_VALUE_NODES = 1024


def count_nodes(impl: Any, budget: int) -> int:
    """The nodes of the `pn_data_t *` `impl` (0 for NULL), counted up to `budget + 1` at
    most: the walk stops there, so its cost is bounded whatever the peer sent. Proton
    caps one tree at 65,535 nodes, a count a 10-byte array of nulls reaches."""
    if not impl:
        return 0
    lib.pn_data_rewind(impl)
    count = 0
    depth = 0
    while count <= budget:
        if lib.pn_data_next(impl):
            count += 1
            if lib.pn_data_type(impl) in _COMPOUND:
                lib.pn_data_enter(impl)
                depth += 1
        elif depth:
            lib.pn_data_exit(impl)
            depth -= 1
        else:
            break
    lib.pn_data_rewind(impl)
    return count


# Scalar node types: read with Data.get_object, which is safe for them.
_SCALARS = frozenset(
    (
        Data.NULL,
        Data.BOOL,
        Data.UBYTE,
        Data.BYTE,
        Data.USHORT,
        Data.SHORT,
        Data.UINT,
        Data.INT,
        Data.CHAR,
        Data.ULONG,
        Data.LONG,
        Data.TIMESTAMP,
        Data.FLOAT,
        Data.DOUBLE,
        Data.DECIMAL32,
        Data.DECIMAL64,
        Data.DECIMAL128,
        Data.UUID,
        Data.BINARY,
        Data.STRING,
        Data.SYMBOL,
    )
)


_COMPOUND = frozenset((Data.LIST, Data.MAP, Data.ARRAY, Data.DESCRIBED))


def data_at(impl: Any) -> Data | None:
    """A `Data` over a `pn_data_t *` the C API returned (None for NULL: no such field)."""
    return Data(impl) if impl else None


def read_data(data: Data | None, field: str) -> Any:
    """The one value held by `data` (None when empty), every node checked.

    Raises:
        PeerDecodeError: the tree does not hold a well-formed value.
        PeerValueTooLarge: it holds more than `MAX_VALUE_NODES` values.
    """
    if data is None:
        return None
    data.rewind()
    if not data.next():
        return None
    try:
        value = _node(data, field, 0, [MAX_VALUE_NODES])
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, OverflowError) as e:
        raise PeerDecodeError(field, f"malformed value ({e})") from None
    if data.next():
        raise PeerDecodeError(field, "more than one value")
    return value


def _node(data: Data, field: str, depth: int, left: list[int]) -> Any:
    """The value at the cursor; `left`: how many more nodes the field may have (the walk
    stops there, before it reads more)."""
    left[0] -= 1
    if left[0] < 0:
        raise PeerValueTooLarge(field, f"more than {MAX_VALUE_NODES} values")
    kind = data.type()
    if kind in _SCALARS:
        return data.get_object()
    if depth >= MAX_DEPTH:
        raise PeerDecodeError(field, f"nests deeper than {MAX_DEPTH} levels")
    if kind == Data.LIST:
        return _children(data, field, depth, data.get_list(), left)
    if kind == Data.MAP:
        items = _children(data, field, depth, data.get_map(), left)
        if len(items) % 2:
            raise PeerDecodeError(field, "a map with an odd number of elements")
        try:
            return dict(zip(items[::2], items[1::2], strict=True))
        except TypeError:
            raise PeerDecodeError(field, "a map with an unhashable key") from None
    if kind == Data.DESCRIBED:
        pair = _children(data, field, depth, 2, left)
        return Described(pair[0], pair[1])
    if kind == Data.ARRAY:
        count, described, element_type = data.get_array()
        items = _children(data, field, depth, count + (1 if described else 0), left)
        if element_type is None or (element_type not in _SCALARS and element_type not in _NESTED):
            raise PeerDecodeError(field, f"an array of unsupported element type {element_type}")
        descriptor = items.pop(0) if described else None
        if any(not _is_type(item, element_type) for item in items):
            raise PeerDecodeError(field, "an array whose elements differ in type")
        return Array(descriptor if described else UNDESCRIBED, element_type, *items)
    raise PeerDecodeError(field, f"a value of unknown type {kind}")


def _children(data: Data, field: str, depth: int, declared: int, left: list[int]) -> list[Any]:
    """The children of the current node; exactly `declared` of them, or a decode error."""
    items: list[Any] = []
    data.enter()
    try:
        while data.next():
            if len(items) == declared:
                raise PeerDecodeError(field, f"more elements than the {declared} declared")
            items.append(_node(data, field, depth + 1, left))
    finally:
        data.exit()
    if len(items) != declared:
        raise PeerDecodeError(field, f"claims {declared} elements but holds {len(items)}")
    return items


# What each array element type decodes to (Data.get_object's Python types).
_ELEMENT_CHECKS: dict[int, Callable[[Any], bool]] = {
    Data.SYMBOL: lambda v: isinstance(v, symbol),
    Data.STRING: lambda v: isinstance(v, str) and not isinstance(v, symbol),
    Data.LIST: lambda v: isinstance(v, list),
    Data.MAP: lambda v: isinstance(v, dict),
    Data.ARRAY: lambda v: isinstance(v, Array),
}
_NESTED = frozenset((Data.LIST, Data.MAP, Data.ARRAY))


def _is_type(item: Any, element_type: int) -> bool:
    check = _ELEMENT_CHECKS.get(element_type)
    if check is not None:
        return check(item)
    return not isinstance(item, list | dict | Described | Array | str)


def read_symbols(data: Data | None, field: str) -> tuple[str, ...]:
    """A `symbol multiple` field (capabilities, outcomes): one symbol or an array of them.

    Strings are accepted where symbols belong (some clients send them).
    """
    value = read_data(data, field)
    if value is None:
        return ()
    if isinstance(value, str):
        return (_ascii(value, field),)
    items = value.elements if isinstance(value, Array) else value
    if isinstance(items, list | tuple) and all(isinstance(v, str) for v in items):
        return tuple(_ascii(v, field) for v in items)
    raise PeerInvalidField(field, f"expected a symbol or an array of symbols, got {_kind(value)}")


def read_symbol_map(data: Data | None, field: str) -> dict[str, Any]:
    """A `fields` map (properties): symbol keys; values any well-formed AMQP value."""
    value = read_data(data, field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PeerInvalidField(field, f"expected a map, got {_kind(value)}")
    if not all(isinstance(k, str) for k in value):
        raise PeerInvalidField(field, "map keys must be symbols")
    return {str(k): v for k, v in value.items()}


def read_filter_set(data: Data | None, field: str) -> dict[Any, Described | None]:
    """A source's filter-set: symbol keys, described (or null) values."""
    value = read_data(data, field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PeerInvalidField(field, f"expected a filter-set map, got {_kind(value)}")
    for key, item in value.items():
        if not isinstance(key, str):
            raise PeerInvalidField(field, "filter names must be symbols")
        if item is not None and not isinstance(item, Described):
            raise PeerInvalidField(field, f"filter {key!s} is not a described value")
    return value


def read_text(getter: Callable[[], T], field: str) -> T:
    """A string field proton decodes itself (names, addresses): bad UTF-8 is a decode error."""
    try:
        return getter()
    except UnicodeDecodeError:
        raise PeerDecodeError(field, "not valid UTF-8") from None


def read_link_name(link: Link) -> str:
    """The attach's `name`: a mandatory string (checked once, at attach)."""
    name = read_text(lambda: link.name, "attach.name")
    if not isinstance(name, str):
        raise PeerInvalidField("attach.name", "missing")
    return name


def name_for_log(link: Link) -> str:
    """A link's name for a log line, whatever bytes the peer sent."""
    raw = lib.pn_link_name(link._impl)
    return ffi.string(raw).decode("utf-8", "replace") if raw else "-"


def _ascii(value: str, field: str) -> str:
    if not value.isascii():
        raise PeerInvalidField(field, f"symbol {value!r} is not ASCII")
    return str(value)


def _kind(value: Any) -> str:
    return type(value).__name__
