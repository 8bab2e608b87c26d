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
        over = self.ratio * 100 > self.max_usage_percent
        if over == self.full:
            return
        self.full = over
        percent = f"{self.ratio:.1%}"
        if over:
            free = max(total - used, 0)
            log.warning(
                "disk usage %s of %d bytes (%d free) is beyond max-disk-usage %d%%: "
                "durable sends are refused until it falls (AMQ222210)",
                percent,
                total,
                free,
                self.max_usage_percent,
            )
            self._persistence.set_disk_full(
                DiskFull(f"disk usage {percent} is beyond max-disk-usage {self.max_usage_percent}%")
            )
        else:
            log.info(
                "disk usage %s is under max-disk-usage %d%% again: durable sends are accepted",
                percent,
                self.max_usage_percent,
            )
            self._persistence.set_disk_full(None)
