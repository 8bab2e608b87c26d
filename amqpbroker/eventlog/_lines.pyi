"""Stub of `_lines.c`, the event-log writer process's common line in C (compiled build only)."""

from collections.abc import Callable
from typing import Any

def lines(
    first_seq: int,
    events: list[tuple[Any, ...]],
    info: dict[int, tuple[str, str, str]],
    messages: dict[int, tuple[str, str, str]],
    shapes: dict[Any, tuple[str, str, str]],
    message_info: Callable[[int, bytes | int, int], tuple[str, str, str]],
    cache_message: Callable[..., tuple[str, str, str]],
    cache_shape: Callable[[Any, tuple[Any, ...], tuple[str, ...] | None], tuple[str, str, str]],
    fallback: Callable[[int, list[tuple[Any, ...]]], str],
    /,
) -> bytes: ...
def keep_memory() -> bool:
    """glibc's malloc keeps what the process frees (no trim, no mmap below 32 MiB);
    False where there is no glibc (nothing done)."""
