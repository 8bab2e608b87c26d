"""Durable storage: the `Journal` protocol, its memory and file implementations, the
record codec, recovery (`JournalState`) and `export_jsonl` (STYLE.md section 7)."""

from amqpbroker.store.codec import CodecError
from amqpbroker.store.journal import (
    DEFAULT_SEGMENT_BYTES,
    CompactionResult,
    FileJournal,
    Journal,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalFailed,
    JournalState,
    MemoryJournal,
    OnDurable,
    RecoveredRef,
    export_jsonl,
)

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "CodecError",
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
