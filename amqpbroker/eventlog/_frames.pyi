"""Stub of `_frames.c`, the event-log frame's payload in marshal's format (compiled build
only; `writer.payload_of`)."""

from typing import Any

def dumps(value: Any, /) -> bytes: ...
