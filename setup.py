"""Build hook: compile the broker's hot modules with mypyc when asked (issue 20).

The project's metadata lives in pyproject.toml; this file only adds C extensions, and only
with `AMQPBROKER_MYPYC=1` (mypy installed in the building environment, so
`pip install --no-build-isolation`; `make bench` builds .bench/.venv this way). The
modules in HOT_MODULES are already `mypy --strict`: mypyc turns them into C extensions
with the same behaviour, and each message costs ~30% fewer instructions (callgrind, README
"Performance"). Without the variable, without mypy or a C compiler, or if the compile
fails, the same modules install as pure Python: nothing else changes.

Editable installs (`make run`, `make test`) stay pure Python: a compiled module next to
its source would shadow later edits of that source.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The per-message path (callgrind): decode, queue, refs, route, lifecycle events, the
# shell, a connection's event loop and transfers (`protocol/transfers.py`, a part of
# `AmqpConnection` by composition), `Broker`'s own methods (publish, settle, credit), the
# clock read per call, the effects, the redelivery decision of every return (released,
# modified), the journal writer's per-record index work (`store/indexing.py`), and the
# walk of every incoming frame's size and code (`protocol/handles.py`, fourth attack pass).
# Mixins stay pure Python (`Broker`'s, `AmqpConnection`'s attach and transactions): mypyc
# makes a class native, and a native mixin's methods refuse the class that combines them;
# `Broker`, which combines them, is compiled as a regular Python class
# (`mypyc_attr(native_class=False)`: compiled methods, attributes in its `__dict__`).
# `AmqpConnection` cannot be (mypyc 2.4 fails on its lambdas), nor store/file_journal.py
# (its per-append framing is store/framing.py, compiled), and core/ids.py does not build
# (mypyc's C for an `int`-returning `__next__`).
HOT_MODULES = [
    "amqpbroker/amqp/sections.py",
    "amqpbroker/core/queue.py",
    "amqpbroker/core/postoffice.py",
    "amqpbroker/core/model.py",
    "amqpbroker/core/lifecycle.py",
    "amqpbroker/protocol/shell.py",
    "amqpbroker/core/settings.py",
    "amqpbroker/core/persistence.py",
    "amqpbroker/store/codec.py",
    "amqpbroker/store/framing.py",
    "amqpbroker/store/indexing.py",
    "amqpbroker/core/refs.py",
    "amqpbroker/protocol/transfers.py",
    "amqpbroker/protocol/dispositions.py",
    "amqpbroker/protocol/handles.py",
    "amqpbroker/core/broker.py",
    "amqpbroker/core/clock.py",
    "amqpbroker/core/effects.py",
    "amqpbroker/core/redelivery.py",
    "amqpbroker/store/frames.py",
    "amqpbroker/store/locs.py",
    "amqpbroker/store/liveness.py",
    "amqpbroker/store/state.py",
    "amqpbroker/store/recovery.py",
    "amqpbroker/core/totals.py",  # `BrokerStats.routed += 1` per message: native (issue 20)
]

# Hand-written C beside mypyc's, built with it (the same compiler, no other dependency),
# each with a pure-Python fallback in the module that imports it: the open's bulk frame
# reader, crc included (issue 23 item 4, docs/decisions.md "Recovery, fifth pass"); the
# hot path's engine calls, fused, proton's pointers as ints (issue 20, `protocol/pnloop.py`,
# which falls back to proton's binding call by call without it); the event-log writer
# process's common line (issue 20, `eventlog/child.py`, which runs `_format` without it);
# the event-log frame's payload in marshal's format, in one pass and one allocation
# (issue 20, `eventlog/writer.py`, marshal without it).
C_MODULES = {
    "amqpbroker.store._framescan": "amqpbroker/store/_framescan.c",
    "amqpbroker.protocol._pnloop": "amqpbroker/protocol/_pnloop.c",
    "amqpbroker.eventlog._lines": "amqpbroker/eventlog/_lines.c",
    "amqpbroker.eventlog._frames": "amqpbroker/eventlog/_frames.c",
}


def _say(text: str) -> None:
    sys.stderr.write(f"amqpbroker setup.py: {text}\n")


class OptionalBuildExt(build_ext):
    """Build the extensions; on any failure remove what was built and go on without."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # a compiler error, a missing header: pure Python then
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            _say(f"mypyc build failed ({e}); installing pure Python")


def ext_modules() -> list[Any]:
    if os.environ.get("AMQPBROKER_MYPYC") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("AMQPBROKER_MYPYC=1 but no mypyc: pure Python")
        return []
    modules = [m for m in HOT_MODULES if Path(m).is_file()]
    try:
        compiled = list(mypycify(modules, opt_level="3"))
    except BaseException as e:  # mypyc exits (SystemExit) on a type error
        _say(f"mypyc cannot compile ({e!r}); pure Python")
        return []
    return compiled + [
        Extension(name, [source], extra_compile_args=["-O2"]) for name, source in C_MODULES.items()
    ]


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
