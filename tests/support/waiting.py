"""Bounded waiting: poll a predicate instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 15.0,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Return the first truthy value of `predicate()`, or fail after `timeout` seconds.

    The default is generous (a loaded 2-core host held a writer process past 5 s): it
    costs nothing when the condition comes, and every test is bounded by pytest-timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
