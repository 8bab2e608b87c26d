"""Random and adversarial values for the event-log frame's C payload (`_frames.c`,
ninth attack pass): every value it accepts must read back with `marshal.loads` equal to
the value, item types included, and to what marshal reads of `marshal.dumps`; a value it
refuses (ValueError) goes to `frames.dumps` in the broker (`writer.payload_of`).

Build the module with the sanitizers and run it under them (docs/decisions.md "Hostile
input, ninth attack pass"), e.g. in a scratch directory S:

    gcc -O1 -g -fsanitize=address,undefined -shared -fPIC -I$(python3 -c 'import \
sysconfig;print(sysconfig.get_paths()["include"])') amqpbroker/eventlog/_frames.c \
-o S/_frames$(python3-config --extension-suffix)
    LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so) \
ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=S python3 tests/fuzz/frames_fuzz.py SEED SECONDS

It prints `done CASES ACCEPTED REFUSED` and exits 1 at the first mismatch.
"""

from __future__ import annotations

import marshal
import random
import sys
import time
from typing import Any

import _frames  # type: ignore[import-not-found]  # (the sanitized build, on PYTHONPATH)


class Sym(str):
    """An AMQP symbol as proton gives it: a str subclass."""


class ULong(int):
    """A typed AMQP int as proton gives it: an int subclass."""


R = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
EDGES = [
    *(2**31, -(2**31), -(2**31) - 1, 2**31 - 1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1),
    *(2**60, 2**60 - 1, -(2**60), 2**30, 2**30 - 1, -(2**30), 2**45, 0, -1),
]
shared: list[Any] = []


def text() -> str:
    k = R.randrange(8)
    if k == 0:
        return ""
    if k == 1:
        return "".join(chr(R.randrange(0x20, 0x7F)) for _ in range(R.randrange(300)))
    if k == 2:
        points = [R.randrange(0x80, 0x800), R.randrange(0xD800, 0xE000), 0]
        points += [R.randrange(0x10000, 0x110000)]
        return "".join(chr(R.choice(points)) for _ in range(R.randrange(20)))
    if k == 3:
        return "x" * R.choice([255, 256, 257, 65536])
    if k == 4:
        return Sym("sym")
    return "a\udc80" if R.random() < 0.3 else "é" * R.randrange(300)


def integer() -> int:
    k = R.randrange(7)
    if k == 0:
        return R.randrange(-(2**31) - 5, 2**31 + 5)
    if k == 1:
        return R.choice(EDGES)
    if k == 2:
        return R.randrange(-(2**64), 2**64)
    if k == 3:
        return R.randrange(-(2**200), 2**200)
    if k == 4:
        return ULong(5)
    if k == 5:
        return R.random() < 0.5
    return R.randrange(-(2**62), 2**62)


def value(depth: int = 0) -> Any:
    k = R.randrange(12 if depth < 6 else 5)
    if k == 0:
        return None
    if k == 1:
        return integer()
    if k == 2:
        return text()
    if k == 3:
        return bytes(R.randrange(256) for _ in range(R.choice([0, 1, 255, 256, 257, 1000])))
    if k == 4:
        if shared and R.random() < 0.7:
            return R.choice(shared)
        return R.choice([1.5, {}, b"", (), bytearray(b"x")])
    if k in (5, 6, 7):
        wide = depth < 2 and R.random() < 0.1
        n = R.choice([0, 1, 2, 5, 255, 256]) if wide else R.randrange(5)
        made = tuple(value(depth + 1) for _ in range(n))
        if R.random() < 0.3:
            shared.append(made)
        return made
    if k == 8:
        return [value(depth + 1) for _ in range(R.randrange(5))]
    if k == 9:
        data = b"m" * R.choice([10, 300])
        shared.append(data)
        return data
    if k == 10 and shared:
        return R.choice(shared)
    return text()


def deep(n: int, kind: type) -> Any:
    made: Any = None
    for _ in range(n):
        made = kind((made, 1))
    return made


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def main() -> int:
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60
    start = time.time()
    cases = accepted = refused = 0
    while time.time() - start < seconds:
        shared.clear()
        if R.random() < 0.02:
            made = deep(R.choice([30, 31, 32, 33, 100, 5000]), R.choice([tuple, list]))
        elif R.random() < 0.2:
            made = value()
        else:
            made = (R.randrange(2**40), R.randrange(2**45), [value() for _ in range(10)])
        cases += 1
        try:
            out = _frames.dumps(made)
        except ValueError:
            refused += 1
            continue
        accepted += 1
        back = marshal.loads(out)
        if not same(back, made) or marshal.loads(marshal.dumps(made)) != back:
            sys.stdout.write(f"MISMATCH {repr(made)[:300]}\n")
            return 1
    sys.stdout.write(f"done {cases} {accepted} {refused}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
