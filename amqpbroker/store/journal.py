"""The journal: where durable state goes, and where it comes back from after a restart.

Theory of operation
-------------------
The broker describes every durable change as a record (`core/records.py`) and appends
records to a `Journal`; the state after a restart is what `JournalState` computes by
applying `replay()` in order. This module names the journal's public parts; each lives
in its own module:

- `api.py`: the `Journal` protocol, its errors, `CompactionResult`, `OnDurable`;
- `liveness.py`: which records still matter (`_LiveSet`), shared by all below;
- `state.py`: `JournalState` and `RecoveredRef`, what recovery rebuilds;
- `memory.py`: `MemoryJournal`;
- `segments.py`: the segment file format, frame checks and write helpers;
- `file_journal.py`: `FileJournal` (group commit, held appends, the liveness index), with
  its parts `opening.py` (the lock, reading segments back, a torn tail), `failure.py`
  (taking a failed pass back, retry with backoff) and `compaction.py`;
- `export.py`: `export_jsonl`.

Their private parts (the index's `locs.py` with its packs and compact index, the open's
`frames.py` and `_framescan.c`, an append's `framing.py`, the writer's `indexing.py`) are
listed in docs/architecture.md's table.
"""

from typing import TYPE_CHECKING

from amqpbroker.store.api import (
    CompactionResult,
    Journal,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalFailed,
    OnDurable,
)
from amqpbroker.store.export import export_jsonl
from amqpbroker.store.file_journal import DEFAULT_SEGMENT_BYTES, FileJournal
from amqpbroker.store.memory import MemoryJournal
from amqpbroker.store.state import JournalState, RecoveredRef

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "CompactionResult",
    "FileJournal",
    "Journal",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "JournalFailed",
    "JournalState",
    "MemoryJournal",
    "OnDurable",
    "RecoveredRef",
    "export_jsonl",
]


if TYPE_CHECKING:

    def _implement_the_protocol(memory: MemoryJournal, file: FileJournal) -> list[Journal]:
        return [memory, file]
