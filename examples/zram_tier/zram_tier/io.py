"""The worker half of the zram tier: each block zlib-compressed under its slot, with its key.

A read checks that the slot holds the block asked for (a misplaced record is never served) and
that it decompresses to a whole block; the handler recomputes whatever a read refuses.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence

from kvoffload.offload.abstract import BlockHash
from kvoffload.transfer.result import BlockTransferError
from kvoffload.transfer.tier_io import TierIO


class ZramIO(TierIO):
    name = "zram tier"

    def __init__(self, level: int = 1) -> None:
        self.level = level
        self._records: dict[int, tuple[BlockHash, bytes]] = {}
        self._lock = threading.Lock()  # the handler runs reads and writes on its own threads
        self.stored_bytes = self.compressed_bytes = 0

    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        packed = [(slot, key, zlib.compress(block, self.level), len(block)) for block, slot, key in zip(blocks, slots, keys)]
        with self._lock:
            for slot, key, data, size in packed:
                self._records[slot] = (key, data)
                self.stored_bytes += size
                self.compressed_bytes += len(data)

    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        with self._lock:
            found = [self._records.get(slot) for slot in slots]
        bad = [slot for slot, key, rec in zip(slots, keys, found) if rec is None or rec[0] != key]
        if bad:
            raise BlockTransferError(f"zram tier: slots {bad} hold no record of the block asked for", bad)
        for slot, rec, view in zip(slots, found, out):
            assert rec is not None
            data = zlib.decompress(rec[1])
            if len(data) != len(view):
                raise BlockTransferError(f"zram tier: slot {slot} holds {len(data)} bytes, not a block of {len(view)}",
                                         [slot])
            view[:] = data
