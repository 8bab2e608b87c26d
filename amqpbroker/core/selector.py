"""JMS message selectors for queue filters, consumer selectors and management (B-130…B-132).

Theory of operation. `parse_selector` scans the text by hand, parses it by recursive descent
into a small tree of nodes, checks operand types the way Artemis's parser does, and compiles
the tree into nested closures. The closures for `Message` resolve each identifier through a
getter chosen once, at compile time (B-131 order), so evaluation never re-examines names.
`evaluate(resolver)` compiles a second closure tree on first use, over any `name -> value`
function (a dict's `.get`).

Values during evaluation are None (SQL NULL / unknown), bool, int, float, str, or something
opaque (bytes, uuid). Conditions are True, False or None (three-valued logic); a message
matches only when the whole selector is True. Artemis semantics kept (SEL/ and
`SRV/core/filter/impl/FilterImpl.java`):
* `=`/`<>` and ordering across kinds (string vs number, boolean vs number) are FALSE, not
  unknown, so `NOT (color = 5)` is TRUE; numbers compare across int/float;
* `/` and `%` always work in floating point (`7 / 2 = 3.5`; `x / 0` is infinity, not an
  error); `+ - *` on integers wrap as Java longs; `'a' + x` concatenates;
* `IN` on a non-string is unknown; `LIKE` on a non-string is FALSE; `-x` on a non-number is
  unknown; a bare identifier used as a condition is FALSE unless it holds a boolean;
* a runtime failure (arithmetic on a string, ordering of opaque values, an undecodable
  section) makes the message not match and is never raised.

Decisions where Artemis is accidental (spec B-130 "three-valued logic applies"):
* `missing = 'x'`, `'x' = missing` and `missing = missing2` are all unknown (Artemis gives
  FALSE / TRUE for the last two);
* `NOT` binds looser than comparisons, as in JMS 2.0 (`NOT a = 1` is `NOT (a = 1)`);
  Artemis's grammar makes it `(NOT a) = 1`, which never matches;
* a `--` comment may end the selector without a newline (Artemis needs the newline, but
  trims it away first, so a trailing comment there silently changes the expression);
* `'PERSISTENT'`/`'NON_PERSISTENT'` become `'DURABLE'`/`'NON_DURABLE'` only where compared
  with `JMSDeliveryMode`/`AMQDurable` (Artemis rewrites every such literal in the text).
"""

from __future__ import annotations

import contextlib
import decimal
import functools
import logging
import math
import operator
import re
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from amqpbroker.core.errors import InvalidSelector
from amqpbroker.core.model import Message
from amqpbroker.core.moves import INTERNAL_PROPERTIES

log = logging.getLogger(__name__)

Resolver = Callable[[str], Any]
_Fn = Callable[[Any], Any]  # env (a Message or a Resolver) -> value
_Leaf = Callable[[str], _Fn]  # identifier -> getter over env

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1

# -- tokens --------------------------------------------------------------------------------

_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
)
_RESERVED = frozenset({"XPATH", "XQUERY"})  # Artemis body filters; not supported (B-130)
_MODE_MARKERS = (
    "convert_string_expressions:",
    "hyphenated_props:",
    "no_convert_string_expressions:",
    "no_hyphenated_props:",
)
_WHITESPACE = frozenset(" \t\n\r\f")  # exactly the JavaCC grammar's
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_$")
_DIGITS = frozenset("0123456789")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_ID_PART = _LETTERS | _DIGITS
_SINGLE_OPS = frozenset("=+-*/%(),")
_EXPONENT = re.compile(r"[eE][+-]?[0-9]")
_LINE_END = re.compile(r"[\n\r]")
# The longest decimal integer literal: Python's int() refuses more than 4300 digits
# (sys.int_info.default_max_str_digits); a Java long has 19.
_MAX_DECIMAL_DIGITS = 4300
# What one selector may cost (issue 15, sixth attack pass; B-130 and Artemis set no
# bound). A selector is parsed on the event loop and evaluated there for every message it
# is offered: an 880 KB `a=1 OR a=1 ...` (an HTTP filter or a management request may be
# 1 MiB) took 4 CPU-s to parse, kept 72 MB, and 1.3 s per message to evaluate; a chain of
# 900 `x + x + ...` over a 100 KB property took 35 CPU-s per message (each `+` copies the
# string so far). Real selectors are tens of operands and a few hundred characters.
MAX_SELECTOR_CHARS = 64 * 1024  # the text, IN lists and literals included
MAX_SELECTOR_OPERANDS = 1024  # identifiers and literals outside IN lists: the tree's size
MAX_CONCAT_CHARS = 64 * 1024  # what a string `+` may make; longer is a runtime failure
# What one LIKE may compare while it searches for its runs with `_` (eighth attack pass):
# such a run is checked a place at a time, each place over the whole run, so a 2,000
# character run against a 300,000 character property was 40 CPU-s of the event loop per
# message. Each place tried counts the run's length; past this many characters the
# evaluation is a runtime failure, so no match (B-130). ~10-40 ms of C at most; a real
# pattern (a run of tens of characters) never reaches it on any property.
LIKE_STEPS = 1 << 23
LIKE_PIECE_STEPS = 32  # a piece's `startswith` call, in characters compared


class _Token:
    __slots__ = ("kind", "pos", "text", "value")

    def __init__(self, kind: str, value: Any, pos: int, text: str) -> None:
        self.kind = kind  # "num" "str" "id" "kw" "op" "eof"
        self.value = value
        self.pos = pos
        self.text = text

    def describe(self) -> str:
        return "end of selector" if self.kind == "eof" else repr(self.text)


def _invalid(reason: str, pos: int, found: str = "") -> InvalidSelector:
    """The refusal text (B-032); config check-config and the attach description show it."""
    return InvalidSelector(f"Invalid filter: {reason} at position {pos}{found}")


class _Scanner:
    """Hand-written tokenizer following StrictParser.jj / HyphenatedParser.jj lexemes."""

    def __init__(self, source: str, start: int, *, hyphenated: bool) -> None:
        self.source = source
        self.i = start
        self.id_part = _ID_PART | {"-"} if hyphenated else _ID_PART

    def fail(self, reason: str, pos: int) -> InvalidSelector:
        return _invalid(reason, pos)

    def tokens(self) -> list[_Token]:
        out: list[_Token] = []
        while (token := self.next()).kind != "eof":
            out.append(token)
        out.append(token)
        return out

    def skip_blanks(self) -> None:
        s, n = self.source, len(self.source)
        while self.i < n:
            if s[self.i] in _WHITESPACE:
                self.i += 1
            elif s.startswith("--", self.i):
                # One search for either line end: a find for each scanned to the end of
                # the text for a kind that never came, per comment (quadratic).
                line_end = _LINE_END.search(s, self.i)
                self.i = line_end.end() if line_end else n
            elif s.startswith("/*", self.i):
                end = s.find("*/", self.i + 2)
                if end < 0:
                    raise self.fail("unterminated /* comment", self.i)
                self.i = end + 2
            else:
                return

    def next(self) -> _Token:
        self.skip_blanks()
        s, start = self.source, self.i
        if start >= len(s):
            return _Token("eof", None, start, "")
        ch = s[start]
        if ch in _LETTERS:
            return self.word()
        if ch in _DIGITS or (ch == "." and s[start + 1 : start + 2] in _DIGITS):
            return self.number()
        if ch == "'":
            value = self.quoted("'", "string literal")
            return _Token("str", value, start, s[start : self.i])
        if ch == '"':
            value = self.quoted('"', "quoted identifier")
            return _Token("id", value, start, s[start : self.i])
        if ch in "<>":
            two = s[start : start + 2]
            op = two if two in ("<>", "<=", ">=") else ch
            self.i += len(op)
            return _Token("op", op, start, op)
        if ch in _SINGLE_OPS:
            self.i += 1
            return _Token("op", ch, start, ch)
        raise self.fail(f"unexpected character {ch!r}", start)

    def word(self) -> _Token:
        s, start, part = self.source, self.i, self.id_part
        end = start + 1
        while end < len(s) and s[end] in part:
            end += 1
        self.i = end
        text = s[start:end]
        upper = text.upper()
        if upper in _KEYWORDS:
            return _Token("kw", upper, start, text)
        if upper in _RESERVED:
            raise self.fail(f"{upper} filters are not supported", start)
        return _Token("id", text, start, text)

    def digits(self, allowed: frozenset[str]) -> None:
        s = self.source
        while self.i < len(s) and s[self.i] in allowed:
            self.i += 1

    def number(self) -> _Token:
        s, start = self.source, self.i
        if s[start : start + 2] in ("0x", "0X") and s[start + 2 : start + 3] in _HEX_DIGITS:
            self.i = start + 2
            self.digits(_HEX_DIGITS)
            return self.integer(start, int(s[start + 2 : self.i], 16))
        self.digits(_DIGITS)
        is_float = False
        if s[self.i : self.i + 1] == ".":
            is_float = True
            self.i += 1
            self.digits(_DIGITS)
        exponent = _EXPONENT.match(s, self.i)
        if exponent:
            is_float = True
            self.i = exponent.end()
            self.digits(_DIGITS)
        text = s[start : self.i]
        if is_float:
            return _Token("num", float(text), start, text)
        if text.startswith("0") and len(text) > 1:
            if not set(text) <= set("01234567"):
                raise self.fail(f"invalid octal literal {text!r}", start)
            return self.integer(start, int(text, 8))
        if len(text) > _MAX_DECIMAL_DIGITS:
            # int() refuses more (ValueError, an internal error at attach: issue 15 attack)
            raise self.fail("integer literal out of range", start)
        return self.integer(start, int(text), decimal=True)

    def integer(self, start: int, value: int, *, decimal: bool = False) -> _Token:
        """Optional `L` suffix; hex and octal must fit a Java long (decimal may not)."""
        if self.source[self.i : self.i + 1] in ("l", "L"):
            self.i += 1
        if not decimal and value > _LONG_MAX:
            raise self.fail("integer literal out of range", start)
        return _Token("num", value, start, self.source[start : self.i])

    def quoted(self, quote: str, what: str) -> str:
        s, start = self.source, self.i
        parts: list[str] = []
        i = start + 1
        while True:
            end = s.find(quote, i)
            if end < 0:
                raise self.fail(f"unterminated {what}", start)
            parts.append(s[i:end])
            if s[end + 1 : end + 2] != quote:
                self.i = end + 1
                return quote.join(parts)
            i = end + 2  # a doubled quote stands for one


# -- evaluation helpers --------------------------------------------------------------------


class _EvalError(Exception):
    """A runtime failure inside a selector: the message does not match (B-130)."""


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _is_number(v: Any) -> bool:
    t = v.__class__
    return t is int or t is float or (t is not bool and isinstance(v, int | float))


def _kind(v: Any) -> int:
    """0 number, 1 string, 2 boolean, 3 anything else (compared only with its own type)."""
    t = v.__class__
    if t is str:
        return 1
    if t is bool:
        return 2
    if t is int or t is float or isinstance(v, int | float):
        return 0
    return 1 if isinstance(v, str) else 3


def _wrap_long(v: int) -> int:
    """Java long overflow: integer arithmetic wraps at 64 bits."""
    if _LONG_MIN <= v <= _LONG_MAX:
        return v
    return ((v - _LONG_MIN) & 0xFFFF_FFFF_FFFF_FFFF) + _LONG_MIN


_JAVA_INT = re.compile(r"[+-]?[0-9]+")  # what Long.valueOf accepts


def _string_as(model: Any, text: str) -> Any:
    """convert_string_expressions: `text` as the type of `model` (Boolean.valueOf,
    Long.valueOf or Double.valueOf), or None when it does not parse."""
    if model.__class__ is bool:
        return text.lower() == "true"
    if isinstance(model, int):
        return int(text) if _JAVA_INT.fullmatch(text) else None
    try:
        return float(text)
    except ValueError:
        return None


def _converted(a: Any, ka: int, b: Any, kb: int) -> tuple[Any, Any] | None:
    """Artemis ComparisonExpression.compare: a string against a number or boolean, as that
    type; None (the comparison is FALSE) for other mixes and unparsable strings."""
    if ka == 1 and kb in (0, 2):
        converted = _string_as(b, a)
        return None if converted is None else (converted, b)
    if kb == 1 and ka in (0, 2):
        converted = _string_as(a, b)
        return None if converted is None else (a, converted)
    return None


# The opaque values (kind 3) compared by value: binary (a memcmp) and UUIDs. Lists, maps
# and described values, which AMQP does not allow in application-properties, compare as
# unknown and order as a failure: Python compared them element by element, and 512
# `p = q` over two 100,000-element lists took 1 CPU-s per message (sixth attack pass).
_BY_VALUE = (bytes, uuid.UUID)


def _equal(a: Any, b: Any, convert: bool) -> bool | None:
    if a is None or b is None:
        return None
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        pair = _converted(a, ka, b, kb) if convert else None
        if pair is None:
            return False
        a, b = pair
    elif ka == 3 and not (isinstance(a, _BY_VALUE) and isinstance(b, _BY_VALUE)):
        return None
    return bool(a == b)


def _order(op: Callable[[Any, Any], Any], a: Any, b: Any, convert: bool) -> bool | None:
    if a is None or b is None:
        return None
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        pair = _converted(a, ka, b, kb) if convert else None
        if pair is None:
            return False
        a, b = pair
    elif ka == 3:  # opaque values have no order (Java: ClassCastException); see _BY_VALUE
        raise _EvalError(f"cannot order values of type {type(a).__name__}")
    try:
        return bool(op(a, b))
    except TypeError:
        raise _EvalError(f"cannot order {type(a).__name__} and {type(b).__name__}") from None


def _as_number(v: Any, convert: bool) -> Any:
    """ArithmeticExpression.asNumber: a number, else a runtime failure."""
    if _is_number(v):
        return v
    if convert and isinstance(v, str):
        if _JAVA_INT.fullmatch(v):
            return int(v)
        if "." in v:
            with contextlib.suppress(ValueError):
                return float(v)
    raise _EvalError(f"not a number: {v!r}")


def _java_string(v: Any) -> str:
    """String.valueOf for the right operand of a string `+`; a list, map or described
    value is a failure (its text would be made whole first: see _BY_VALUE)."""
    if _kind(v) == 3 and not isinstance(v, _BY_VALUE):
        raise _EvalError(f"cannot add a {type(v).__name__} to a string")
    if v.__class__ is bool:
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        if v == 0 or 1e-3 <= abs(v) < 1e7:
            return repr(v)
        # Double.toString: shortest digits, computerized scientific notation (1.0E10)
        _, digits, exponent = decimal.Decimal(repr(abs(v))).normalize().as_tuple()
        text = "".join(map(str, digits))
        power = len(text) - 1 + int(exponent)
        return f"{'-' if v < 0 else ''}{text[0]}.{text[1:] or '0'}E{power}"
    return str(v)


def _arith(op: str, a: Any, b: Any, convert: bool) -> Any:
    """ArithmeticExpression: NULL in, NULL out; `/` and `%` in floating point."""
    if a is None or b is None:
        return None
    if op == "+" and isinstance(a, str):
        # Checked before the copy is made: a long value never gets copied (`bytes`, whose
        # Java string is at least as long, is not converted either).
        if len(a) + (len(b) if isinstance(b, str | bytes) else 0) > MAX_CONCAT_CHARS:
            raise _EvalError(f"a string longer than {MAX_CONCAT_CHARS} characters")
        text = a + _java_string(b)
        if len(text) > MAX_CONCAT_CHARS:
            raise _EvalError(f"a string longer than {MAX_CONCAT_CHARS} characters")
        return text
    x, y = _as_number(a, convert), _as_number(b, convert)
    if op == "/":  # Java double division: x / 0 is infinite or NaN, not an error
        fx, fy = float(x), float(y)
        if fy != 0.0:
            return fx / fy
        if fx == 0.0 or math.isnan(fx):
            return math.nan
        return math.copysign(math.inf, fx) * math.copysign(1.0, fy)
    if op == "%":  # Java double remainder (sign of the dividend)
        fx, fy = float(x), float(y)
        if fy == 0.0 or math.isinf(fx) or math.isnan(fx) or math.isnan(fy):
            return math.nan
        return math.fmod(fx, fy)
    if op == "+":
        r = x + y
    elif op == "-":
        r = x - y
    else:
        r = x * y
    return _wrap_long(r) if isinstance(r, int) else r


# -- tree ----------------------------------------------------------------------------------


class _Node:
    """A parsed expression. `condition` nodes are Artemis BooleanExpressions."""

    __slots__ = ("pos",)
    condition: ClassVar[bool] = False

    def __init__(self, pos: int) -> None:
        self.pos = pos

    def compile(self, leaf: _Leaf) -> _Fn:
        raise NotImplementedError

    def compile_condition(self, leaf: _Leaf) -> _Fn:
        """As a condition: True, False or None (a bare identifier is cast)."""
        return self.compile(leaf)


class _Const(_Node):
    __slots__ = ("value",)

    def __init__(self, pos: int, value: Any) -> None:
        super().__init__(pos)
        self.value = value

    def compile(self, leaf: _Leaf) -> _Fn:
        value = self.value
        return lambda env: value


class _BoolConst(_Const):
    """TRUE, FALSE and NULL: Artemis makes these boolean expressions."""

    __slots__ = ()
    condition = True


class _Ident(_Node):
    __slots__ = ("name",)

    def __init__(self, pos: int, name: str) -> None:
        super().__init__(pos)
        self.name = name

    def compile(self, leaf: _Leaf) -> _Fn:
        return leaf(self.name)

    def compile_condition(self, leaf: _Leaf) -> _Fn:
        get = leaf(self.name)

        def cast(env: Any) -> bool | None:  # UnaryExpression.createBooleanCast
            v = get(env)
            return v if v is None or v.__class__ is bool else False

        return cast


class _Negate(_Node):
    __slots__ = ("operand",)

    def __init__(self, pos: int, operand: _Node) -> None:
        super().__init__(pos)
        self.operand = operand

    def compile(self, leaf: _Leaf) -> _Fn:
        get = self.operand.compile(leaf)

        def negate(env: Any) -> Any:
            v = get(env)
            if not _is_number(v):
                return None  # Artemis: negating a non-number is NULL, not an error
            return _wrap_long(-v) if isinstance(v, int) else -v

        return negate


class _Arith(_Node):
    __slots__ = ("convert", "left", "op", "right")

    def __init__(self, pos: int, op: str, left: _Node, right: _Node, *, convert: bool) -> None:
        super().__init__(pos)
        self.op, self.left, self.right, self.convert = op, left, right, convert

    def compile(self, leaf: _Leaf) -> _Fn:
        a, b = self.left.compile(leaf), self.right.compile(leaf)
        op, convert = self.op, self.convert
        return lambda env: _arith(op, a(env), b(env), convert)


class _Logic(_Node):
    __slots__ = ("is_and", "items")
    condition = True

    def __init__(self, pos: int, *, is_and: bool, items: list[_Node]) -> None:
        super().__init__(pos)
        self.is_and, self.items = is_and, items

    def compile(self, leaf: _Leaf) -> _Fn:
        fns = [item.compile_condition(leaf) for item in self.items]
        if len(fns) == 2:
            a, b = fns
            return _and2(a, b) if self.is_and else _or2(a, b)
        return _and_n(fns) if self.is_and else _or_n(fns)


# Three-valued AND/OR (Artemis LogicExpression): False (True) decides at once, left to right,
# so a later operand that would fail at runtime is never evaluated.


def _and2(a: _Fn, b: _Fn) -> _Fn:
    def both(env: Any) -> bool | None:
        x = a(env)
        if x is False:
            return False
        y = b(env)
        if y is False:
            return False
        return None if x is None or y is None else True

    return both


def _or2(a: _Fn, b: _Fn) -> _Fn:
    def either(env: Any) -> bool | None:
        x = a(env)
        if x is True:
            return True
        y = b(env)
        if y is True:
            return True
        return None if x is None or y is None else False

    return either


def _and_n(fns: list[_Fn]) -> _Fn:
    def every(env: Any) -> bool | None:
        unknown = False
        for fn in fns:
            x = fn(env)
            if x is False:
                return False
            unknown = unknown or x is None
        return None if unknown else True

    return every


def _or_n(fns: list[_Fn]) -> _Fn:
    def some(env: Any) -> bool | None:
        unknown = False
        for fn in fns:
            x = fn(env)
            if x is True:
                return True
            unknown = unknown or x is None
        return None if unknown else False

    return some


class _Not(_Node):
    __slots__ = ("operand",)
    condition = True

    def __init__(self, pos: int, operand: _Node) -> None:
        super().__init__(pos)
        self.operand = operand

    def compile(self, leaf: _Leaf) -> _Fn:
        return _inverted(self.operand.compile_condition(leaf))


def _inverted(get: _Fn) -> _Fn:
    """Three-valued NOT."""
    return lambda env: None if (v := get(env)) is None else not v


_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ORDER_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _with_constant(node: _Node, other: _Node) -> tuple[_Node, Any] | None:
    """(the non-constant side, the constant) when exactly `other` is a literal."""
    if isinstance(other, _Const) and not isinstance(node, _Const):
        return node, other.value
    return None


class _Equal(_Node):
    __slots__ = ("convert", "left", "negated", "right")
    condition = True

    def __init__(
        self, pos: int, left: _Node, right: _Node, *, negated: bool, convert: bool
    ) -> None:
        super().__init__(pos)
        self.left, self.right, self.negated, self.convert = left, right, negated, convert

    def compile(self, leaf: _Leaf) -> _Fn:
        fn = self._equal(leaf)
        return _inverted(fn) if self.negated else fn

    def _equal(self, leaf: _Leaf) -> _Fn:
        pair = _with_constant(self.left, self.right) or _with_constant(self.right, self.left)
        if pair is None or self.convert:
            a, b = self.left.compile(leaf), self.right.compile(leaf)
            convert = self.convert
            return lambda env: _equal(a(env), b(env), convert)
        node, c = pair
        get = node.compile(leaf)
        if isinstance(c, str):

            def equal_string(env: Any) -> bool | None:
                v = get(env)
                if v is None:
                    return None
                return v == c if v.__class__ is str or isinstance(v, str) else False

            return equal_string
        if c.__class__ is bool:
            return lambda env: None if (v := get(env)) is None else v is c

        def equal_number(env: Any) -> bool | None:
            v = get(env)
            if v is None:
                return None
            t = v.__class__
            if t is int or t is float or (t is not bool and isinstance(v, int | float)):
                return bool(v == c)
            return False

        return equal_number


class _Order(_Node):
    __slots__ = ("convert", "left", "op", "right")
    condition = True

    def __init__(self, pos: int, op: str, left: _Node, right: _Node, *, convert: bool) -> None:
        super().__init__(pos)
        self.op, self.left, self.right, self.convert = op, left, right, convert

    def compile(self, leaf: _Leaf) -> _Fn:
        convert = self.convert
        op = self.op
        pair = _with_constant(self.left, self.right)
        if pair is None and (pair := _with_constant(self.right, self.left)) is not None:
            op = _MIRROR[op]  # `2 < x` is `x > 2`
        if pair is None or convert:
            a, b, fn = self.left.compile(leaf), self.right.compile(leaf), _ORDER_OPS[self.op]
            return lambda env: _order(fn, a(env), b(env), convert)
        node, c = pair  # the parser only lets number literals into an ordering
        get, compare = node.compile(leaf), _ORDER_OPS[op]

        def order_number(env: Any) -> bool | None:
            v = get(env)
            if v is None:
                return None
            t = v.__class__
            if t is int or t is float or (t is not bool and isinstance(v, int | float)):
                return bool(compare(v, c))
            return False

        return order_number


class _Between(_Node):
    __slots__ = ("convert", "high", "low", "negated", "value")
    condition = True

    def __init__(
        self, pos: int, value: _Node, low: _Node, high: _Node, *, negated: bool, convert: bool
    ) -> None:
        super().__init__(pos)
        self.value, self.low, self.high = value, low, high
        self.negated, self.convert = negated, convert

    def compile(self, leaf: _Leaf) -> _Fn:
        # Artemis: AND(v >= low, v <= high); NOT BETWEEN is OR(v < low, v > high).
        get, negated = self.value.compile(leaf), self.negated
        if isinstance(self.low, _Const) and isinstance(self.high, _Const) and not self.convert:
            lo, hi = self.low.value, self.high.value

            def between_numbers(env: Any) -> bool | None:
                v = get(env)
                if v is None:
                    return None
                if not _is_number(v):
                    return False
                return bool(v < lo or v > hi) if negated else bool(lo <= v <= hi)

            return between_numbers
        below, above = ("<", ">") if negated else (">=", "<=")
        parts: list[_Node] = [
            _Order(self.pos, below, self.value, self.low, convert=self.convert),
            _Order(self.pos, above, self.value, self.high, convert=self.convert),
        ]
        return _Logic(self.pos, is_and=not negated, items=parts).compile(leaf)


class _In(_Node):
    __slots__ = ("ident", "negated", "values")
    condition = True

    def __init__(self, pos: int, ident: _Ident, values: list[str], *, negated: bool) -> None:
        super().__init__(pos)
        self.ident, self.values, self.negated = ident, values, negated

    def compile(self, leaf: _Leaf) -> _Fn:
        get, negated = self.ident.compile(leaf), self.negated
        members = frozenset(self.values)

        def within(env: Any) -> bool | None:
            v = get(env)
            if v.__class__ is not str and not isinstance(v, str):
                return None  # Artemis: NULL for a missing or non-string value
            return (v in members) is not negated

        return within


class _Like(_Node):
    __slots__ = ("escape", "negated", "operand", "pattern")
    condition = True

    def __init__(
        self, pos: int, operand: _Node, pattern: str, escape: str | None, *, negated: bool
    ) -> None:
        super().__init__(pos)
        self.operand, self.pattern, self.escape, self.negated = operand, pattern, escape, negated

    def compile(self, leaf: _Leaf) -> _Fn:
        get, negated = self.operand.compile(leaf), self.negated
        test = _like_matcher(self.pattern, self.escape)

        def like(env: Any) -> bool | None:
            v = get(env)
            if v is None:
                return None
            if v.__class__ is not str and not isinstance(v, str):
                return negated  # Artemis: LIKE on a non-string is FALSE, so NOT LIKE is TRUE
            return test(v) is not negated

        return like


class _IsNull(_Node):
    __slots__ = ("negated", "operand")
    condition = True

    def __init__(self, pos: int, operand: _Node, *, negated: bool) -> None:
        super().__init__(pos)
        self.operand, self.negated = operand, negated

    def compile(self, leaf: _Leaf) -> _Fn:
        get = self.operand.compile(leaf)
        if self.negated:
            return lambda env: get(env) is not None
        return lambda env: get(env) is None


def _like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """LIKE: `%` any run, `_` one character. As Artemis LikeExpression, the escape character
    escapes only `%`, `_` or itself; anywhere else it is an ordinary pattern character."""
    items: list[str | None] = []  # literal text, or None for '%', or '' for '_'
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == escape and i + 1 < len(pattern) and pattern[i + 1] in ("%", "_", escape):
            literal, i = pattern[i + 1], i + 2
        elif ch == "%":
            if not items or items[-1] is not None:
                items.append(None)
            i += 1
            continue
        elif ch == "_":
            items.append("")
            i += 1
            continue
        else:
            literal, i = ch, i + 1
        if items and isinstance(items[-1], str) and items[-1] != "":
            items[-1] += literal
        else:
            items.append(literal)
    # Only literals and '%': plain string tests are faster than a regex.
    literals = [item for item in items if item]
    shape = tuple(item is None for item in items)
    if "" not in items and len(literals) <= 1:
        lit = literals[0] if literals else ""
        match shape:
            case () | (False,):
                return lambda s: s == lit
            case (True,):
                return lambda s: True
            case (False, True):
                return lambda s: s.startswith(lit)
            case (True, False):
                return lambda s: s.endswith(lit)
            case (True, False, True):
                return lambda s: lit in s
    # The runs between '%'s: text, or a tuple of characters and None for '_'. A regex of
    # `.*a.*a.*...b` backtracks exponentially: `'%a' * 8 + '%b'` against 40 a's took
    # 6.4 s of the event loop, every connection stalled (issue 15 attack). The first run
    # is matched at the start, the last at the end and each run between at its leftmost
    # place after the one before: a '%' takes whatever lies between, so the leftmost
    # place never loses a match. Linear in the string per run.
    # (Lists, not `tuple +=`: that copied the run so far at each item, quadratic, 4.6 s
    # of the event loop to compile `'a_' * 30000`, at every attach; eighth attack pass.)
    parts: list[list[str | None]] = [[]]
    for item in items:
        if item is None:
            parts.append([])
        elif item:
            parts[-1].extend(item)
        else:
            parts[-1].append(None)
    runs = tuple(_Run(tuple(part)) for part in parts)
    return functools.partial(_like_runs, runs)


class _Run:
    """A run of a LIKE pattern between '%'s: characters, None for '_' (any one)."""

    __slots__ = ("anchor", "chars", "pieces", "size", "text")

    def __init__(self, chars: tuple[str | None, ...]) -> None:
        self.chars = chars
        self.size = len(chars)
        # Without '_': the text itself, for str.startswith / endswith / find.
        self.text = None if None in chars else "".join(ch for ch in chars if ch is not None)
        # With '_': the literal pieces between them at their offsets, each compared by
        # one `startswith` (C); the places tried are those where the longest piece is
        # (`anchor`, "" for a run of only '_'s). (A regex per run compiled in ~60 us a
        # character: 3.5 s for a 60,000-character pattern, at every compile.)
        pieces: list[tuple[int, str]] = []
        piece: list[str] = []
        for i, ch in enumerate((*chars, None)):
            if ch is not None:
                piece.append(ch)
            elif piece:
                pieces.append((i - len(piece), "".join(piece)))
                piece = []
        self.pieces = tuple(pieces)
        self.anchor = max(pieces, key=lambda p: len(p[1]), default=(0, ""))

    def at(self, s: str, pos: int) -> bool:
        """Whether the run matches `s` at `pos`."""
        if pos < 0 or pos + self.size > len(s):
            return False
        if self.text is not None:
            return s.startswith(self.text, pos)
        return all(s.startswith(text, pos + offset) for offset, text in self.pieces)

    def find(self, s: str, start: int, end: int, steps: int) -> tuple[int, int]:
        """The leftmost place of the run in `s[start:end]` (or -1), and `steps` less what
        the search compared (each place tried costs the run's length and
        LIKE_PIECE_STEPS a piece).

        Raises:
            _EvalError: the search went past LIKE_STEPS (a runtime failure, B-130).
        """
        if self.text is not None:
            return s.find(self.text, start, end), steps
        last = end - self.size  # the last place the run fits
        offset, anchor = self.anchor
        cost = self.size + LIKE_PIECE_STEPS * len(self.pieces)
        while start <= last:
            if anchor:
                found = s.find(anchor, start + offset, last + offset + len(anchor))
                if found < 0:
                    return -1, steps
                start = found - offset
            steps -= cost
            if steps < 0:
                raise _EvalError(f"LIKE compared more than {LIKE_STEPS} characters")
            if self.at(s, start):
                return start, steps
            start += 1
        return -1, steps


def _like_runs(runs: tuple[_Run, ...], s: str) -> bool:
    """LIKE over the runs between '%'s (`_like_matcher`)."""
    first, last = runs[0], runs[-1]
    if len(runs) == 1:
        return len(s) == first.size and first.at(s, 0)
    end = len(s) - last.size
    if end < first.size or not first.at(s, 0) or not last.at(s, end):
        return False
    pos = first.size
    steps = LIKE_STEPS
    for run in runs[1:-1]:
        found, steps = run.find(s, pos, end, steps)
        if found < 0:
            return False
        pos = found + run.size
    return True


# -- parser --------------------------------------------------------------------------------

_DELIVERY_MODES = {"PERSISTENT": "DURABLE", "NON_PERSISTENT": "NON_DURABLE"}
# B-132/B-033: JMS header names stand for broker fields (Artemis SelectorTranslator).
_JMS_HEADERS = {
    "JMSDeliveryMode": "AMQDurable",
    "JMSPriority": "AMQPriority",
    "JMSTimestamp": "AMQTimestamp",
    "JMSMessageID": "AMQUserID",
    "JMSExpiration": "AMQExpiration",
    "JMSXGroupID": "AMQGroupID",
}


def _durable_literal(node: _Node, other: _Node) -> _Node:
    """B-132: 'PERSISTENT'/'NON_PERSISTENT' compared with JMSDeliveryMode mean the
    AMQDurable values. Artemis rewrites these literals everywhere; we only do it here."""
    if (
        isinstance(node, _Const)
        and isinstance(other, _Ident)
        and other.name == "AMQDurable"
        and node.value in _DELIVERY_MODES
    ):
        return _Const(node.pos, _DELIVERY_MODES[node.value])
    return node


class _Parser:
    """Recursive descent, loosest first: OR, AND, NOT, `=`/`<>`/IS, `<`…/LIKE/BETWEEN/IN,
    `+ -`, `* / %`, unary `+ -`. Operand checks are Artemis's (`asBooleanExpression`,
    `checkLessThanOperand`, `checkEqualOperand`)."""

    def __init__(self, source: str, tokens: list[_Token], *, convert: bool) -> None:
        self.source = source
        self.tokens = tokens
        self.i = 0
        self.convert = convert
        self.operands = 0  # leaves made so far (MAX_SELECTOR_OPERANDS)

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def fail(self, expected: str, token: _Token | None = None) -> InvalidSelector:
        token = token or self.tok
        return _invalid(f"expected {expected}", token.pos, f", found {token.describe()}")

    def reject(self, reason: str, node: _Node) -> InvalidSelector:
        return _invalid(reason, node.pos)

    def accept(self, kind: str, value: str) -> bool:
        token = self.tok
        if token.kind == kind and token.value == value:
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value: str | None, expected: str) -> _Token:
        token = self.tok
        if token.kind != kind or (value is not None and token.value != value):
            raise self.fail(expected)
        self.i += 1
        return token

    def condition(self, node: _Node) -> _Node:
        if not (node.condition or isinstance(node, _Ident)):
            raise self.reject("a condition (this expression is not a boolean)", node)
        return node

    def orderable(self, node: _Node, op: str) -> _Node:
        if node.condition or (isinstance(node, _Const) and not _is_number(node.value)):
            raise self.reject(f"a number or identifier on either side of {op}", node)
        return node

    def equatable(self, node: _Node, op: str) -> _Node:
        if isinstance(node, _Const) and node.value is None:
            raise self.reject(f"NULL cannot be compared with {op}; use IS [NOT] NULL", node)
        return node

    def selector(self) -> _Node:
        node = self.condition(self.or_expr())
        if self.tok.kind != "eof":
            raise self.fail("AND, OR, an operator or the end of the selector")
        return node

    def or_expr(self) -> _Node:
        first = self.and_expr()
        items = [first]
        while self.accept("kw", "OR"):
            items.append(self.condition(self.and_expr()))
        if len(items) == 1:
            return first
        self.condition(first)
        return _Logic(first.pos, is_and=False, items=items)

    def and_expr(self) -> _Node:
        first = self.not_expr()
        items = [first]
        while self.accept("kw", "AND"):
            items.append(self.condition(self.not_expr()))
        if len(items) == 1:
            return first
        self.condition(first)
        return _Logic(first.pos, is_and=True, items=items)

    def not_expr(self) -> _Node:
        token = self.tok
        if self.accept("kw", "NOT"):
            return _Not(token.pos, self.condition(self.not_expr()))
        return self.equality()

    def equality(self) -> _Node:
        node = self.relational()
        while True:
            token = self.tok
            if token.kind == "op" and token.value in ("=", "<>"):
                self.i += 1
                right = self.equatable(self.relational(), token.value)
                self.equatable(node, token.value)
                if (
                    isinstance(node, _Const)
                    and isinstance(right, _Const)
                    and (node.value.__class__ is bool) != (right.value.__class__ is bool)
                ):
                    raise self.reject("a boolean literal compared with a non-boolean", right)
                node, right = _durable_literal(node, right), _durable_literal(right, node)
                node = _Equal(
                    token.pos, node, right, negated=token.value == "<>", convert=self.convert
                )
            elif self.accept("kw", "IS"):
                negated = self.accept("kw", "NOT")
                self.expect("kw", "NULL", "NULL after IS" + (" NOT" if negated else ""))
                node = _IsNull(token.pos, node, negated=negated)
            else:
                return node

    def relational(self) -> _Node:
        node = self.additive()
        while True:
            token = self.tok
            if token.kind == "op" and token.value in _ORDER_OPS:
                self.i += 1
                right = self.orderable(self.additive(), token.value)
                self.orderable(node, token.value)
                node = _Order(token.pos, token.value, node, right, convert=self.convert)
                continue
            negated = False
            if token.kind == "kw" and token.value == "NOT":
                following = self.tokens[self.i + 1]
                if not (following.kind == "kw" and following.value in ("LIKE", "BETWEEN", "IN")):
                    raise self.fail("LIKE, BETWEEN or IN after NOT", following)
                self.i += 1
                negated = True
            if self.accept("kw", "LIKE"):
                node = self.like(token.pos, node, negated=negated)
            elif self.accept("kw", "BETWEEN"):
                self.orderable(node, "BETWEEN")
                low = self.orderable(self.additive(), "BETWEEN")
                self.expect("kw", "AND", "AND between the BETWEEN bounds")
                high = self.orderable(self.additive(), "BETWEEN")
                node = _Between(token.pos, node, low, high, negated=negated, convert=self.convert)
            elif self.accept("kw", "IN"):
                if not isinstance(node, _Ident):
                    raise self.reject("an identifier on the left of IN", node)
                self.expect("op", "(", "'(' after IN")
                values = [self.string("a string literal in the IN list")]
                while self.accept("op", ","):
                    values.append(self.string("a string literal after ','"))
                self.expect("op", ")", "',' or ')' in the IN list")
                if node.name == "AMQDurable":
                    values = [_DELIVERY_MODES.get(v, v) for v in values]
                node = _In(token.pos, node, values, negated=negated)
            else:
                return node

    def like(self, pos: int, node: _Node, *, negated: bool) -> _Node:
        pattern = self.string("a string literal pattern after LIKE")
        escape = None
        if self.accept("kw", "ESCAPE"):
            token = self.tok
            escape = self.string("a string literal after ESCAPE")
            if len(escape) != 1:
                raise _invalid(f"ESCAPE must be one character, not {escape!r}", token.pos)
        if isinstance(node, _Ident) and node.name == "AMQDurable":
            pattern = _DELIVERY_MODES.get(pattern, pattern)
        return _Like(pos, node, pattern, escape, negated=negated)

    def string(self, expected: str) -> str:
        return str(self.expect("str", None, expected).value)

    def additive(self) -> _Node:
        node = self.multiplicative()
        while (token := self.tok).kind == "op" and token.value in ("+", "-"):
            self.i += 1
            right = self.multiplicative()
            node = _Arith(token.pos, token.value, node, right, convert=self.convert)
        return node

    def multiplicative(self) -> _Node:
        node = self.unary()
        while (token := self.tok).kind == "op" and token.value in ("*", "/", "%"):
            self.i += 1
            right = self.unary()
            node = _Arith(token.pos, token.value, node, right, convert=self.convert)
        return node

    def unary(self) -> _Node:
        token = self.tok
        if self.accept("op", "+"):
            return self.unary()  # Artemis: unary plus returns its operand unchanged
        if self.accept("op", "-"):
            operand = self.unary()
            if isinstance(operand, _Const) and _is_number(operand.value):
                return _Const(token.pos, -operand.value)  # a negative literal
            return _Negate(token.pos, operand)
        return self.primary()

    def primary(self) -> _Node:
        token = self.tok
        self.i += 1
        if token.kind in ("num", "str", "id", "kw"):
            self.operands += 1
            if self.operands > MAX_SELECTOR_OPERANDS:
                raise _invalid(
                    f"more than {MAX_SELECTOR_OPERANDS} identifiers and literals", token.pos
                )
        if token.kind == "num" or token.kind == "str":
            return _Const(token.pos, token.value)
        if token.kind == "id":
            return _Ident(token.pos, _JMS_HEADERS.get(token.value, token.value))
        if token.kind == "kw" and token.value in ("TRUE", "FALSE", "NULL"):
            return _BoolConst(token.pos, {"TRUE": True, "FALSE": False, "NULL": None}[token.value])
        if token.kind == "op" and token.value == "(":
            node = self.or_expr()
            self.expect("op", ")", "')'")
            return node
        self.i -= 1
        raise self.fail("a value, an identifier or '('")


# -- identifier resolution for messages (B-131, B-132) ------------------------------------


def _normalized(v: Any) -> Any:
    """Unsigned integers as signed 64-bit (B-131 step 4); binary as bytes."""
    if isinstance(v, int) and v > _LONG_MAX:
        return v - 2**64
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    return v


def _binary_string(value: bytes) -> str:
    """proton-j Binary.toString: printable ASCII as is, anything else as \\xNN."""
    return "".join(chr(b) if 31 < b < 127 and b != 0x5C else f"\\x{b:02x}" for b in value)


def _user_id(message: Message) -> str | None:
    """AMQUserID: "ID:" + the message-id's string form, without a double prefix (B-132)."""
    value = message.get_properties().get("message-id")
    if value is None:
        return None
    text = _binary_string(value) if isinstance(value, bytes) else str(value)
    return text if text.startswith("ID:") else "ID:" + text


_ID_ENCODINGS = ("AMQP_BINARY:", "AMQP_UUID:", "AMQP_ULONG:", "AMQP_STRING:", "AMQP_NO_PREFIX:")


def _correlation_id(message: Message) -> str | bytes | None:
    """JMSCorrelationID as Artemis AMQPMessageIdHelper.toCorrelationIdStringOrBytes."""
    value = message.get_properties().get("correlation-id")
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        if value.startswith("ID:") and value.startswith(_ID_ENCODINGS, 3):
            return "ID:AMQP_STRING:" + value
        return value
    if isinstance(value, int):
        return f"ID:AMQP_ULONG:{value}"
    return f"ID:AMQP_UUID:{value}"


def _user_name(message: Message) -> str | None:
    value = message.get_properties().get("user-id")
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value


def _property(name: str) -> Callable[[Message], Any]:
    return lambda m: _normalized(m.get_properties().get(name))


def _creation_time(message: Message) -> int:
    created = message.get_properties().get("creation-time")
    return int(created) if created is not None else 0


_BROKER_FIELDS: dict[str, Callable[[Message], Any]] = {
    "AMQPriority": lambda m: m.priority,
    "AMQDurable": lambda m: "DURABLE" if m.durable else "NON_DURABLE",
    "AMQTimestamp": _creation_time,
    "AMQExpiration": lambda m: m.expiration_ms,
    "AMQUserID": _user_id,
    "AMQGroupID": _property("group-id"),
    "AMQSize": lambda m: m.size,
    "AMQAddress": lambda m: m.address or None,
}
_SPECIAL: dict[str, Callable[[Message], Any]] = {
    "JMSType": _property("subject"),
    "JMSCorrelationID": _correlation_id,
    "JMSXGroupID": _property("group-id"),
    "JMSXGroupSeq": _property("group-sequence"),
    "JMSXUserID": _user_name,
    "__AMQ_CID": lambda m: m.origin_container,
}


def _annotation(key: str) -> Callable[[Message], Any]:
    def annotation(m: Message) -> Any:
        v = m.get_annotations().get(key)
        return v if v.__class__ in _PLAIN else _normalized(v)

    return annotation


def _application_property(name: str) -> Callable[[Message], Any]:
    def application_property(m: Message) -> Any:
        v = m.get_application_properties().get(name)
        return v if v.__class__ in _PLAIN else _normalized(v)

    return application_property


@functools.lru_cache(maxsize=1024)
def message_getter(name: str) -> Callable[[Message], Any]:
    """How identifier `name` reads a `Message`, decided once (B-131 order, B-132 fields).

    1. `AMQ*` broker fields; 2. `m.<key>` message annotations; 3. JMS names mapped onto
    `properties` and `__AMQ_CID`; then `_AMQ_*` internal properties (annotations
    `x-opt-*`, B-090 name mapping) before 4. application-properties (our anti-spoofing
    decision; Artemis looks at application-properties first).
    """
    if name.startswith("AMQ") and name in _BROKER_FIELDS:
        return _BROKER_FIELDS[name]
    if name.startswith("m."):
        return _annotation(name[2:])
    if name in _SPECIAL:
        return _SPECIAL[name]
    if name.startswith("_AMQ_"):
        internal = _annotation("x-opt-" + name[5:].replace("_", "-"))
        if name in INTERNAL_PROPERTIES:  # B-090/B-079: never forged (B-131)
            return internal
        application = _application_property(name)
        return lambda m: v if (v := internal(m)) is not None else application(m)
    return _application_property(name)


def resolve(message: Message, name: str) -> Any:
    """The value identifier `name` has for `message` in a selector (None: absent)."""
    return message_getter(name)(message)


def _resolver_leaf(name: str) -> _Fn:
    return lambda resolver: resolver(name)


# -- public API ----------------------------------------------------------------------------


class Selector:
    """A parsed selector (B-130). `matches` is true only when the expression is TRUE."""

    __slots__ = ("_on_message", "_on_resolver", "_tree", "text")

    def __init__(self, text: str, tree: _Node) -> None:
        self.text = text
        self._tree = tree
        self._on_message: _Fn = tree.compile_condition(message_getter)
        self._on_resolver: _Fn | None = None

    def matches(self, message: Message) -> bool:
        """Whether `message` passes; unknown and runtime failures do not (B-130)."""
        try:
            return self._on_message(message) is True
        except Exception as e:  # B-130: a failure at runtime means "no match", never an error
            log.debug("selector %r failed on %r: %r", self.text, message, e)
            return False

    def evaluate(self, resolver: Resolver) -> bool:
        """Evaluate over any identifier resolver (a dict's `.get`, for example)."""
        if (fn := self._on_resolver) is None:
            fn = self._on_resolver = self._tree.compile_condition(_resolver_leaf)
        try:
            return fn(resolver) is True
        except Exception as e:  # B-130: as in matches()
            log.debug("selector %r failed: %r", self.text, e)
            return False

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


MATCH_ALL = Selector("", _BoolConst(0, True))  # what an empty or blank selector parses to


# 256 entries: a parsed selector may hold ~0.5 MB (MAX_SELECTOR_CHARS of text and up to
# MAX_SELECTOR_OPERANDS compiled), and every distinct text a peer sends was kept.
@functools.lru_cache(maxsize=256)
def parse_selector(text: str) -> Selector:
    """Parse a selector once (B-130); an empty or blank one matches every message.

    Leading `hyphenated_props:` / `convert_string_expressions:` markers (and their `no_`
    forms) switch modes as in Artemis SelectorParser.

    Raises:
        InvalidSelector: naming the position (a 0-based offset into `text`) and what was
            expected there.
    """
    if len(text) > MAX_SELECTOR_CHARS:
        raise InvalidSelector(
            f"Invalid filter: longer than {MAX_SELECTOR_CHARS} characters: {text[:100]!r}"
        )
    start = len(text) - len(text.lstrip())
    if not text[start:].strip():
        return MATCH_ALL
    hyphenated = convert = False
    marker = next((m for m in _MODE_MARKERS if text.startswith(m, start)), None)
    while marker is not None:
        enabled = not marker.startswith("no_")
        if "hyphenated" in marker:
            hyphenated = enabled
        else:
            convert = enabled
        start += len(marker)
        marker = next((m for m in _MODE_MARKERS if text.startswith(m, start)), None)
    tokens = _Scanner(text, start, hyphenated=hyphenated).tokens()
    try:
        return Selector(text, _Parser(text, tokens, convert=convert).selector())
    except RecursionError:
        # Parsing and compiling recurse per level of nesting (parentheses, NOT, signs, a
        # chain of + or *): 400 parentheses, in a 1 KiB attach or an HTTP filter, ended in
        # an internal error (issue 15 attack). Refused like any selector that does not parse.
        raise InvalidSelector(f"Invalid filter: nested too deeply: {text[:100]!r}") from None
