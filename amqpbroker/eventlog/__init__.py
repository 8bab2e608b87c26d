"""The message lifecycle event log (B-170, B-171): see `writer.py` for the theory of
operation.

* `writer.py`: the loop side, `EventLogWriter` (hand-off, bounds, counts);
* `child.py`: the writer process (`python -m amqpbroker.eventlog.child`): formatting,
  files, gzip, the disk budget;
* `frames.py`: the one frame format between them, both ways;
* `retention.py`: which files to delete (pure).

The writer process imports this package too, so it loads `writer` (and with it the
broker's config and core) only when `EventLogWriter` or `HEAD_BYTES` is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpbroker.eventlog.writer import HEAD_BYTES, EventLogWriter

__all__ = ["HEAD_BYTES", "EventLogWriter"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from amqpbroker.eventlog import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
