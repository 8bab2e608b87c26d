"""Artemis `max-disk-usage` / `disk-scan-period`: keep the disk's last room for acks.

Theory of operation
-------------------
When the journal itself fills the disk, consumers can drain every message but their acks
find no room, so a restart brings the messages back and durable sends stay refused (the
user pass, docs/durability.md). Artemis avoids this by measuring the data directory's
file system every `disk-scan-period` ms and blocking producers while its usage is above
`max-disk-usage` percent. `DiskGuard` is that check, sans I/O: the server gives it a
reader (`shutil.disk_usage` of the data directory), the broker's `tick()` calls `check`
when `next_check_ms` comes round (one more deadline in `next_deadline_ms`, no timer of
its own). Over the limit it sets `Persistence.set_disk_full`, so new durable sends are
refused with resource-limit-exceeded exactly as when the journal failed (`broker.
refuse_durable`), and a full PAGE address refuses what it would page (`Broker.
_refusal`); acks, settles, consumers and non-durable sends go on, and their records are
what the remaining room is for. One WARN when the limit is crossed, one INFO
when usage is back under it (docs/decisions.md "max-disk-usage").

Between two scans a fast producer can write a period's worth (5 s at 100 MB/s is half a
gigabyte): the guard adds what the broker has written since the last scan (journal
appends, `Persistence.flush`; page files, `route`) to the usage it measured then, and
as soon as that estimate crosses the limit it refuses and asks for a rescan at the next
tick (`next_check_ms = 0`); the measurement then decides, and the estimate starts again
from it (docs/decisions.md "Loose ends").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("amqpbroker.core.broker")  # the broker's one logger

# (used, total) bytes of the file system holding the data directory.
UsageReader = Callable[[], tuple[int, int]]


class DiskFull(OSError):
    """Why durable sends are refused while the disk is over `max-disk-usage`."""


class _Refuses(Protocol):
    def set_disk_full(self, cause: BaseException | None) -> None: ...


class DiskGuard:
    """Checks the data directory's disk usage against `max-disk-usage` (a percent)."""

    def __init__(
        self,
        *,
        max_usage_percent: int,
        period_ms: int,
        read_usage: UsageReader,
        persistence: _Refuses,
        now_ms: int,
    ) -> None:
        self.max_usage_percent = max_usage_percent
        self.period_ms = period_ms
        self._read_usage = read_usage
        self._persistence = persistence
        self.ratio = 0.0  # used / total at the last check (the metrics gauge)
        self.full = False  # over the limit at the last check: durable sends refused
        self.next_check_ms = now_ms  # the first check on the first tick
        # The last measurement, and what the broker wrote since (`note_written`): the
        # estimate between scans. `_limit_bytes` is the usage the limit allows (None:
        # not measured yet, or the total unknown).
        self.used_bytes = 0
        self.written_bytes = 0
        self._limit_bytes: int | None = None
        self._total_bytes = 0

    def note_written(self, size_bytes: int) -> None:
        """The broker wrote about `size_bytes` more to the data directory. If the last
        measured usage plus what was written since crosses the limit, refuse durable
        sends now and rescan at the next tick, whose measurement decides."""
        self.written_bytes += size_bytes
        limit = self._limit_bytes
        if limit is None or self.full or self.used_bytes + self.written_bytes <= limit:
            return
        self.next_check_ms = 0
        self._refuse(self.used_bytes + self.written_bytes, self._total_bytes, estimated=True)

    def check(self, now_ms: int) -> None:
        """Measure the disk and refuse or take durable sends again on a crossing.

        Over means used/total above the limit, as Artemis (`usage > maxUsage`): 0 refuses
        durable sends while anything at all is on the file system, 100 never does."""
        self.next_check_ms = now_ms + self.period_ms
        try:
            used, total = self._read_usage()
        except OSError as e:  # the directory went away: keep the last answer, say why
            log.debug("disk usage of the data directory not read: %s", e)
            return
        self.ratio = used / total if total > 0 else 0.0
        self.used_bytes, self.written_bytes, self._total_bytes = used, 0, total
        # Over means used * 100 > limit * total; the largest usage that is not over (100
        # never refuses, not even on an estimate past the total; -1 is no check):
        percent = self.max_usage_percent
        self._limit_bytes = percent * total // 100 if total > 0 and 0 <= percent < 100 else None
        over = self.ratio * 100 > self.max_usage_percent
        if over == self.full:
            return
        if over:
            self._refuse(used, total, estimated=False)
        else:
            self.full = False
            log.info(
                "disk usage %s is under max-disk-usage %d%% again: durable sends are accepted",
                f"{self.ratio:.1%}",
                self.max_usage_percent,
            )
            self._persistence.set_disk_full(None)

    def _refuse(self, used: int, total: int, *, estimated: bool) -> None:
        """Over the limit (measured, or estimated between scans): refuse durable sends."""
        self.full = True
        percent = f"{used / total:.1%}" if total > 0 else "?"
        what = "estimated from what was written since the last scan" if estimated else ""
        free = max(total - used, 0)
        log.warning(
            "disk usage %s of %d bytes (%d free)%s is beyond max-disk-usage %d%%: "
            "durable sends are refused until it falls (AMQ222210)",
            percent,
            total,
            free,
            f", {what}," if what else "",
            self.max_usage_percent,
        )
        self._persistence.set_disk_full(
            DiskFull(f"disk usage {percent} is beyond max-disk-usage {self.max_usage_percent}%")
        )
