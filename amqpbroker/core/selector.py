"""JMS message selectors for queue filters, consumer selectors and management (B-130…B-132).

A selector is parsed once into a tree of closures and evaluated per message. Evaluation
uses SQL three-valued logic: a missing property makes a comparison *unknown* (None), and
a message matches only when the whole expression is TRUE. Runtime failures (a division
by zero, a type that cannot be compared) make the message not match; they never raise.

Identifier resolution for AMQP messages (B-131), in order: `AMQ*` broker fields (B-132),
`m.<key>` message annotations, the JMS property names mapped onto `properties`,
`_AMQ_*` broker-internal properties (stored as the `x-opt-*` annotations of a moved
copy, B-090; checked before application-properties so producers cannot spoof them),
then application-properties. JMS header names (`JMSPriority`, ...) are translated to the
broker fields for every selector (B-033: Artemis skips this for subscriptions; we don't).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from amqpbroker.core.errors import InvalidSelector
from amqpbroker.core.model import Message

Resolver = Callable[[str], Any]
_Eval = Callable[[Resolver], Any]

_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
)
_RESERVED = frozenset({"XPATH", "XQUERY"})
# B-132: JMS header names and the broker fields they stand for.
_JMS_HEADERS = {
    "JMSPriority": "AMQPriority",
    "JMSDeliveryMode": "AMQDurable",
    "JMSTimestamp": "AMQTimestamp",
    "JMSExpiration": "AMQExpiration",
    "JMSMessageID": "AMQUserID",
}
_DELIVERY_MODE_LITERALS = {"PERSISTENT": "DURABLE", "NON_PERSISTENT": "NON_DURABLE"}
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|--[^\n]*|/\*.*?\*/)
  | (?P<num>0[xX][0-9a-fA-F]+[lL]?
        | (?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?
        | \d+[eE][+-]?\d+[fFdD]?
        | \d+[lL]?)
  | (?P<str>'(?:[^']|'')*')
  | (?P<qid>"(?:[^"]|"")*")
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|<=|>=|[=<>+\-*/%(),])
    """,
    re.VERBOSE | re.DOTALL,
)
_HYPHEN_ID = re.compile(r"[A-Za-z_$][A-Za-z0-9_$\-]*")


class _Token:
    __slots__ = ("kind", "pos", "value")

    def __init__(self, kind: str, value: Any, pos: int) -> None:
        self.kind, self.value, self.pos = kind, value, pos

    def __repr__(self) -> str:
        return f"{self.value!r}" if self.kind != "eof" else "end of selector"


def _number(text: str) -> int | float:
    body = text.rstrip("lL")
    if body[:2] in ("0x", "0X"):
        return int(body, 16)
    if re.fullmatch(r"0[0-7]+", body):
        return int(body, 8)
    if re.fullmatch(r"\d+", body):
        return int(body)
    return float(text.rstrip("fFdD"))


def _tokenize(text: str, *, hyphenated: bool) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if (
            hyphenated
            and (m := _HYPHEN_ID.match(text, pos))
            and (tokens == [] or tokens[-1].kind != "num")
        ):
            word = m.group()
            if "-" in word:  # only take the hyphenated form when it needs it
                tokens.append(_Token("id", word, pos))
                pos = m.end()
                continue
        m = _TOKEN.match(text, pos)
        if m is None:
            raise InvalidSelector(f"Invalid filter: unexpected {text[pos]!r} at position {pos}")
        kind, raw = m.lastgroup, m.group()
        if kind == "num":
            tokens.append(_Token("num", _number(raw), pos))
        elif kind == "str":
            tokens.append(_Token("str", raw[1:-1].replace("''", "'"), pos))
        elif kind == "qid":
            tokens.append(_Token("id", raw[1:-1].replace('""', '"'), pos))
        elif kind == "id":
            upper = raw.upper()
            if upper in _RESERVED:
                raise InvalidSelector(f"Invalid filter: {raw} is not supported")
            if upper in _KEYWORDS:
                tokens.append(_Token("kw", upper, pos))
            else:
                tokens.append(_Token("id", _JMS_HEADERS.get(raw, raw), pos))
        elif kind == "op":
            tokens.append(_Token("op", raw, pos))
        pos = m.end()
    tokens.append(_Token("eof", None, len(text)))
    return tokens


# -- three-valued logic and comparisons ---------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _compare(op: str, left: Any, right: Any) -> bool | None:
    if left is None or right is None:
        return None
    if _is_number(left) and _is_number(right):
        pass
    elif (
        type(left) is not type(right)
        and not (isinstance(left, str) and isinstance(right, str))
        and not (isinstance(left, bytes) and isinstance(right, bytes))
    ):
        return op == "<>"  # different types are never equal (JMS); ordering is false
    elif op not in ("=", "<>") and not isinstance(left, str):
        return None  # booleans and bytes have equality only
    try:
        if op == "=":
            return bool(left == right)
        if op == "<>":
            return bool(left != right)
        if op == "<":
            return bool(left < right)
        if op == "<=":
            return bool(left <= right)
        if op == ">":
            return bool(left > right)
        return bool(left >= right)
    except TypeError:
        return None


def _arith(op: str, left: Any, right: Any) -> Any:
    if not (_is_number(left) and _is_number(right)):
        return None
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        return None  # a runtime failure: the message does not match
    if isinstance(left, int) and isinstance(right, int):
        quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
        return quotient if op == "/" else left - right * quotient  # Java long semantics
    return left / right if op == "/" else left % right


def _arith_node(op: str, left: _Eval, right: _Eval) -> _Eval:
    return lambda r: _arith(op, left(r), right(r))


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# -- parser -------------------------------------------------------------------------------


class _Parser:
    """Precedence climbing: OR < AND < NOT < comparison < + - < * / % < unary."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def accept(self, kind: str, value: Any = None) -> bool:
        token = self.tok
        if token.kind == kind and (value is None or token.value == value):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value: Any, what: str) -> _Token:
        token = self.tok
        if token.kind != kind or (value is not None and token.value != value):
            self.fail(what)
        return self.take()

    def fail(self, what: str) -> None:
        token = self.tok
        raise InvalidSelector(
            f"Invalid filter: expected {what} at position {token.pos}, found {token!r}"
        )

    def parse(self) -> _Eval:
        node = self.or_expr()
        if self.tok.kind != "eof":
            self.fail("an operator or the end of the selector")
        return node

    def or_expr(self) -> _Eval:
        node = self.and_expr()
        while self.accept("kw", "OR"):
            left, right = node, self.and_expr()

            def either(r: Resolver, a: _Eval = left, b: _Eval = right) -> bool | None:
                x = a(r)
                if x is True:
                    return True
                y = b(r)
                if y is True:
                    return True
                return None if x is None or y is None else False

            node = either
        return node

    def and_expr(self) -> _Eval:
        node = self.not_expr()
        while self.accept("kw", "AND"):
            left, right = node, self.not_expr()

            def both(r: Resolver, a: _Eval = left, b: _Eval = right) -> bool | None:
                x = a(r)
                if x is False:
                    return False
                y = b(r)
                if y is False:
                    return False
                return None if x is None or y is None else True

            node = both
        return node

    def not_expr(self) -> _Eval:
        if self.accept("kw", "NOT"):
            inner = self.not_expr()

            def negate(r: Resolver, a: _Eval = inner) -> bool | None:
                x = a(r)
                return None if x is None else not _truth(x)

            return negate
        return self.comparison()

    def comparison(self) -> _Eval:
        left = self.additive()
        token = self.tok
        if token.kind == "op" and token.value in ("=", "<>", "<", "<=", ">", ">="):
            op = self.take().value
            right = self.additive()
            return lambda r: _compare(op, left(r), right(r))
        if self.accept("kw", "IS"):
            negated = self.accept("kw", "NOT")
            self.expect("kw", "NULL", "NULL after IS")
            return (lambda r: left(r) is not None) if negated else (lambda r: left(r) is None)
        negated = self.accept("kw", "NOT")
        if self.accept("kw", "BETWEEN"):
            low = self.additive()
            self.expect("kw", "AND", "AND in BETWEEN")
            high = self.additive()

            def between(r: Resolver) -> bool | None:
                lo, hi = _compare(">=", left(r), low(r)), _compare("<=", left(r), high(r))
                result = None if lo is None or hi is None else lo and hi
                return result if result is None or not negated else not result

            return between
        if self.accept("kw", "IN"):
            self.expect("op", "(", "'(' after IN")
            values = [self.literal_string("a string in the IN list")]
            while self.accept("op", ","):
                values.append(self.literal_string("a string in the IN list"))
            self.expect("op", ")", "')' closing the IN list")
            members = frozenset(values)

            def within(r: Resolver) -> bool | None:
                value = left(r)
                if value is None:
                    return None
                return (value in members) != negated if isinstance(value, str) else False

            return within
        if self.accept("kw", "LIKE"):
            pattern = self.literal_string("a string pattern after LIKE")
            escape = None
            if self.accept("kw", "ESCAPE"):
                position = self.tok.pos
                escape = self.literal_string("a string after ESCAPE")
                if len(escape) != 1:
                    raise InvalidSelector(
                        f"Invalid filter: ESCAPE must be one character at position {position}"
                    )
            regex = _like_regex(pattern, escape)

            def like(r: Resolver) -> bool | None:
                value = left(r)
                if not isinstance(value, str):
                    return None
                return (regex.fullmatch(value) is not None) != negated

            return like
        if negated:
            self.fail("BETWEEN, IN or LIKE after NOT")
        return left

    def literal_string(self, what: str) -> str:
        token = self.expect("str", None, what)
        return str(token.value)

    def additive(self) -> _Eval:
        node = self.multiplicative()
        while self.tok.kind == "op" and self.tok.value in ("+", "-"):
            op = self.take().value
            node = _arith_node(op, node, self.multiplicative())
        return node

    def multiplicative(self) -> _Eval:
        node = self.unary()
        while self.tok.kind == "op" and self.tok.value in ("*", "/", "%"):
            op = self.take().value
            node = _arith_node(op, node, self.unary())
        return node

    def unary(self) -> _Eval:
        if self.accept("op", "-"):
            inner = self.unary()
            return lambda r: _arith("-", 0, v) if _is_number(v := inner(r)) else None
        if self.accept("op", "+"):
            inner = self.unary()
            return lambda r: v if _is_number(v := inner(r)) else None
        return self.primary()

    def primary(self) -> _Eval:
        token = self.tok
        if self.accept("op", "("):
            node = self.or_expr()
            self.expect("op", ")", "')'")
            return node
        if token.kind in ("num", "str"):
            self.take()
            value = (
                _DELIVERY_MODE_LITERALS.get(token.value, token.value)
                if (token.kind == "str")
                else token.value
            )
            return lambda r: value
        if token.kind == "kw" and token.value in ("TRUE", "FALSE"):
            self.take()
            truth = token.value == "TRUE"
            return lambda r: truth
        if token.kind == "kw" and token.value == "NULL":
            self.take()
            return lambda r: None
        if token.kind == "id":
            self.take()
            name = str(token.value)
            return lambda r: r(name)
        self.fail("a value, an identifier or '('")
        raise AssertionError("unreachable")


def _truth(value: Any) -> bool:
    return value is True


# -- identifier resolution for messages (B-131, B-132) ------------------------------------


def _message_id_string(value: Any) -> str | None:
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if text.startswith("ID:") else "ID:" + text


def _broker_field(message: Message, name: str) -> tuple[bool, Any]:
    if name == "AMQPriority":
        return True, message.priority
    if name == "AMQDurable":
        return True, "DURABLE" if message.durable else "NON_DURABLE"
    if name == "AMQTimestamp":
        created = message.get_properties().get("creation-time")
        return True, int(created) if created is not None else 0
    if name == "AMQExpiration":
        return True, message.expiration_ms
    if name == "AMQUserID":
        return True, _message_id_string(message.get_properties().get("message-id"))
    if name == "AMQGroupID":
        return True, message.get_properties().get("group-id")
    if name == "AMQSize":
        return True, message.size
    if name == "AMQAddress":
        return True, message.address
    return False, None


_PROPERTY_NAMES = {
    "JMSType": "subject",
    "JMSXGroupID": "group-id",
    "JMSXGroupSeq": "group-sequence",
}


def resolve(message: Message, name: str) -> Any:
    """The value of identifier `name` for `message` (B-131 order, with our decision)."""
    if name.startswith("AMQ"):
        known, value = _broker_field(message, name)
        if known:
            return value
    if name.startswith("m."):
        return message.get_annotations().get(name[2:])
    if name in _PROPERTY_NAMES:
        return message.get_properties().get(_PROPERTY_NAMES[name])
    if name == "JMSCorrelationID":
        value = message.get_properties().get("correlation-id")
        return value if value is None or isinstance(value, bytes) else str(value)
    if name == "JMSXUserID":
        value = message.get_properties().get("user-id")
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if name == "__AMQ_CID":
        return message.origin_container
    if name.startswith("_AMQ_"):
        # Internal properties live as the x-opt-* annotations of a moved copy (B-090):
        # _AMQ_ORIG_ADDRESS <-> x-opt-ORIG-ADDRESS. Checked first: not spoofable.
        internal = message.get_annotations().get("x-opt-" + name[5:].replace("_", "-"))
        if internal is not None:
            return internal
    value = message.get_application_properties().get(name)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return value


class Selector:
    """A parsed selector. `matches` is true only when the expression is TRUE."""

    __slots__ = ("_eval", "text")

    def __init__(self, text: str, evaluate: _Eval) -> None:
        self.text = text
        self._eval = evaluate

    def evaluate(self, resolver: Resolver) -> bool:
        """Evaluate against any identifier resolver (a dict's `.get`, for example)."""
        try:
            return self._eval(resolver) is True
        except Exception:  # B-130: a runtime failure means no match, never an error
            return False

    def matches(self, message: Message) -> bool:
        return self.evaluate(functools.partial(resolve, message))

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


_ALWAYS = Selector("", lambda r: True)


@functools.lru_cache(maxsize=4096)
def parse_selector(text: str) -> Selector:
    """Parse a selector (B-130); an empty one matches everything.

    Raises:
        InvalidSelector: with the position and what was expected.
    """
    body = text.strip()
    hyphenated = False
    for marker in ("hyphenated_props:", "convert_string_expressions:"):
        if body.startswith(marker):
            hyphenated = hyphenated or marker == "hyphenated_props:"
            body = body[len(marker) :].strip()
    if not body:
        return _ALWAYS
    return Selector(text, _Parser(_tokenize(body, hyphenated=hyphenated)).parse())
