"""The process's memory as the operating system sees it: the limit, and giving back.

`default_global_max_size()` is B-151's default `global-max-size`: half the memory the
broker may use, as Artemis takes half the JVM heap. The limit is the container's (cgroup v2
`memory.max`, v1 `memory.limit_in_bytes`) when it has one, else the machine's RAM.

`MemoryReturner` gives freed heap back to the system (issue 23): CPython frees small
objects into its own arenas and large buffers (message bodies) with glibc `free()`, which
keeps them in the process's heap unless the top of the heap is free. After a purge or a
drain of a large backlog the RSS would stay at its peak; `malloc_trim(0)` releases the free
pages of every glibc arena. It walks the heap (milliseconds for a GiB), so it runs only when
the broker's queued bytes dropped by a large amount since the last trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["MemoryReturner", "default_global_max_size", "memory_limit_bytes", "rss_bytes"]

_CGROUP_FILES = (
    Path("/sys/fs/cgroup/memory.max"),  # v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # v1
)
_FALLBACK_BYTES = 1 << 30  # no way to tell: assume 1 GiB


def memory_limit_bytes() -> int:
    """The memory this process may use: its cgroup limit if any, else physical RAM."""
    physical = _physical_bytes()
    for path in _CGROUP_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < physical:
            return int(text)
    return physical


def _physical_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return _FALLBACK_BYTES


def default_global_max_size() -> int:
    """B-151: half the memory limit (Artemis: half the JVM heap)."""
    return memory_limit_bytes() // 2


def rss_bytes() -> int:
    """This process's resident memory (VmRSS), 0 when /proc cannot tell."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _malloc_trim() -> Callable[[], bool] | None:
    """glibc's `malloc_trim(0)`, or None on another C library."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


def trim_once() -> bool:
    """`malloc_trim(0)` now, once (False: not glibc, or nothing given back): after a
    one-off burst of frees, the open's records dropped by `FileJournal.state()` (issue
    23, ninth pass: ~65 MB back before a 1M recovery builds its queues)."""
    trim = _trim_function()
    return trim is not None and trim()


@functools.cache
def _trim_function() -> Callable[[], bool] | None:
    """`_malloc_trim()`, looked up once (`find_library` runs a program)."""
    return _malloc_trim()


class MemoryReturner:
    """Calls `malloc_trim` when the queued bytes fell far enough. Loop thread only; the
    server checks every second (its engine timer, which runs from start to stop whether
    or not a connection is open), after each management command, and when a management
    walk has ended.

    Three rules, each measured from its own mark (the highest queued bytes since ...):
    * falling: they fell by `threshold_bytes` since the last trim (`_peak`), so that a
      long drain gives back as it goes;
    * settled: they fell by `settled_bytes` since the last trim of this rule or the next
      (`_high`) and are the same as at the previous check (the drain stopped), so that
      the last part of a drain goes back too (issue 23: RSS 70 MB, not 52, after draining
      a 50 MiB backlog);
    * ended: a management walk has just ended and they fell by `settled_bytes` since the
      last trim of this rule (`_walk_high`). A walk's accounting falls slice by slice but
      its queue frees what it took only at its end (`Queue.compact`): a trim of the other
      rules in between gives nothing back, and when their marks were the only ones, it
      took the whole drop with it, so RSS stayed at its peak after the purge (issue 23:
      the purge test at load ~20, 40.9 -> 116.2 MB for good). This mark is moved only by
      this rule's trims, so a walk's end always sees all that it took (at worst one
      trim more, once per walk)."""

    def __init__(
        self,
        *,
        threshold_bytes: int = 16 * 1024 * 1024,
        settled_bytes: int = 1024 * 1024,
        collect_interval_s: float = 10.0,
        collect_below_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold_bytes = threshold_bytes
        self.settled_bytes = settled_bytes
        self.collect_interval_s = collect_interval_s
        self.collect_below_bytes = collect_below_bytes
        self._clock = clock
        self._trim = _malloc_trim()
        self._peak = 0  # falling rule: the highest since the last trim
        self._high = 0  # settled rule: the highest since its last trim or the ended rule's
        self._walk_high = 0  # ended rule: the highest since its last trim
        self._last = 0  # the queued bytes at the previous check
        self._released = 0  # bytes of dropped transfers of closed connections (`released`)
        self._closed = 0  # connections closed since the last collection (`released`)
        self._collected_at = -collect_interval_s
        self.trims = 0
        self.collections = 0

    def released(self, dropped_bytes: int) -> None:
        """A connection has closed, having dropped `dropped_bytes` of transfers its engine
        had buffered (aborted by the client, over max-message-size). The engine keeps the
        buffers of a connection's deliveries for its next ones (bounded while it is open)
        and frees them with the connection, whose objects make reference cycles: freed
        at the collector's rare full collection, so RSS stayed up by ~25 MB per such
        connection, for good (issue 23: 3 connections of 2 x 12 MiB aborted, 40 -> 116
        MB). The next check collects and trims once they add up to `settled_bytes`, at
        most once per `collect_interval_s` (a full collection walks the heap the broker
        made since its start: a peer cannot make it run more often).

        Any closed connection is collected too, once the queued bytes are below
        `collect_below_bytes`: its engine and objects, in the same cycles, stayed after a
        drain (issue 23: 300k drained, RSS 42.5 -> 491.6 -> 60.3 MiB; 44.8 after a
        collection). Only with little queued, so that the collection is short (it walks
        the queued messages' objects too: a peer that reconnects in a loop cannot stall
        a broker holding a large backlog with it)."""
        self._released += dropped_bytes
        self._closed += 1

    def check(self, queued_bytes: int, *, ended: bool = False) -> bool:
        """Note the queued bytes now; trim when a rule says so (True if it did).

        `ended`: a management walk has just ended, and what it took is freed (the server
        checks then, not after each slice)."""
        settled = queued_bytes == self._last
        self._last = queued_bytes
        self._peak = max(self._peak, queued_bytes)
        self._high = max(self._high, queued_bytes)
        self._walk_high = max(self._walk_high, queued_bytes)
        if self._trim is None:
            return False
        if self._released >= self.settled_bytes or (
            self._closed and queued_bytes <= self.collect_below_bytes
        ):
            now = self._clock()
            if now - self._collected_at >= self.collect_interval_s:
                self._released = self._closed = 0
                self._collected_at = now
                gc.collect()  # the closed connections' engines, and their buffers
                self.collections += 1
                return self._trim_now(queued_bytes, settled=ended or settled, ended=ended)
        if ended and self._walk_high - queued_bytes >= self.settled_bytes:
            return self._trim_now(queued_bytes, settled=True, ended=True)
        if settled and self._high - queued_bytes >= self.settled_bytes:
            return self._trim_now(queued_bytes, settled=True, ended=False)
        if self._peak - queued_bytes >= self.threshold_bytes:
            return self._trim_now(queued_bytes, settled=False, ended=False)
        return False

    def _trim_now(self, queued_bytes: int, *, settled: bool, ended: bool) -> bool:
        """Trim, and move the marks of the rules this trim answers for."""
        assert self._trim is not None
        before = rss_bytes()
        self._trim()
        self.trims += 1
        self._peak = queued_bytes
        if settled:
            self._high = queued_bytes
        if ended:
            self._walk_high = queued_bytes
        log.debug("returned freed memory to the system: RSS %d -> %d", before, rss_bytes())
        return True
