"""Stub of `_framescan.c`, the open's bulk frame reader in C (compiled build only)."""

from amqpbroker.store.codec import Data
from amqpbroker.store.frames import Entry

def scan(
    data: Data | memoryview,
    pos: int,
    batch: list[Entry],
    top: int,
    batches: list[tuple[list[Entry], int]],
    strings: dict[bytes, str],
    /,
) -> tuple[int, list[Entry], int]: ...
def crc32(data: Data, value: int, /) -> int: ...
def crc32_tables(data: Data, value: int, /) -> int: ...

FOLDED_CRC: int  # 1: the CPU folds the crc with PCLMULQDQ (64 bytes and more)
