"""Terminal progress: the job's step and Spark's running stages, on stderr.

Spark's own console bar is off (it interleaves with our lines); a daemon thread polls the
status tracker instead. On a terminal the current line is redrawn in place; otherwise
(CI logs) only finished steps are printed, one line each.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from pyspark import SparkContext


class Progress:
    """`with progress.step("name"):` around each part of the job."""

    def __init__(self, sc: SparkContext, *, total_steps: int, stream: TextIO = sys.stderr) -> None:
        self._sc = sc
        self._stream = stream
        self._tty = stream.isatty()
        self._total = total_steps
        self._number = 0
        self._name = ""
        self._started = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self, name: str) -> Progress:
        self._number += 1
        self._name = name
        return self

    def __enter__(self) -> None:
        self._started = time.monotonic()
        if self._tty:
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll, name="progress", daemon=True)
            self._thread.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if kind is None:
            seconds = time.monotonic() - self._started
            self._write(f"{self._prefix()} done in {seconds:.1f} s", final=True)

    def _prefix(self) -> str:
        return f"[{self._number}/{self._total}] {self._name}"

    def _poll(self) -> None:
        while not self._stop.wait(0.25):
            self._write(f"{self._prefix()} {self._stages()}", final=False)

    def _stages(self) -> str:
        tracker = self._sc.statusTracker()
        parts = []
        for stage_id in sorted(tracker.getActiveStageIds())[:3]:
            info = tracker.getStageInfo(stage_id)
            if info is None or info.numTasks == 0:
                continue
            done = info.numCompletedTasks
            bar = "#" * (20 * done // info.numTasks)
            parts.append(f"stage {stage_id} [{bar:<20}] {done}/{info.numTasks} tasks")
        seconds = time.monotonic() - self._started
        return (" | ".join(parts) or "...") + f"  {seconds:.0f} s"

    def _write(self, text: str, *, final: bool) -> None:
        with self._lock:
            if self._tty:
                self._stream.write("\r\x1b[K" + text + ("\n" if final else ""))
            elif final:
                self._stream.write(text + "\n")
            self._stream.flush()
