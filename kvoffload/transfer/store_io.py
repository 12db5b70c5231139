"""StoreIO: a TierIO over a shared key-value store, for this rank's shard of each block.

Writes copy each block once into a registered staging record (header + bytes) and put the
whole batch in one call; reads get the batch into staging records in one call, check each
record's key and checksum, and copy the payload out. The slot ids the handler passes only
pair blocks with keys; the store is addressed by key.

Errors split the way the scheduler needs them: a store that cannot be reached (RPC or
transfer failure) is an I/O error and counts against the tier's health; a value that is gone
(evicted by the store), torn or of another key is bad data: dropped and recomputed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from kvoffload.kv_store import KeyValueStore
from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.store_keys import StoreKeys
from kvoffload.transfer.handler import BlockTransferError
from kvoffload.transfer.staging_arena import StagingArena
from kvoffload.transfer.store_record import HEADER_BYTES, check_record, write_header
from kvoffload.transfer.tier_io import TierIO


class StoreIO(TierIO):
    def __init__(self, store: KeyValueStore, keys: StoreKeys, rank: int, block_bytes: int, staging_bytes: int) -> None:
        self.name = store.name
        self.store = store
        self.keys = keys
        self.rank = rank
        self.block_bytes = block_bytes
        self.arena = StagingArena(store, HEADER_BYTES + block_bytes, staging_bytes)
        self.num_rejected = 0

    def _chunks(self, n: int) -> Iterator[tuple[int, list[int]]]:
        """(start, rows) pairs covering n blocks, as many at a time as the arena lends."""
        start = 0
        while start < n:
            rows = self.arena.take(n - start)
            try:
                yield start, rows
            finally:
                self.arena.give_back(rows)
            start += len(rows)

    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        names = self.keys.rank_keys(keys, self.rank)
        rows_view = self.arena.rows
        failed: list[int] = []
        io = False
        for start, rows in self._chunks(len(blocks)):
            batch = range(start, start + len(rows))
            for row, i in zip(rows, batch):
                record = rows_view[row]
                record[HEADER_BYTES:] = np.frombuffer(blocks[i], dtype=np.uint8)
                write_header(record, names[i])
            status = self.store.put_from([names[i] for i in batch], [self.arena.address(r) for r in rows],
                                         [self.arena.record_bytes] * len(rows))
            for i, code in zip(batch, status):
                if code < 0:
                    failed.append(slots[i])
                    io = io or self.store.unreachable(code)
        if failed:
            raise BlockTransferError(f"{self.name}: {len(failed)} of {len(blocks)} values not stored", failed, io=io)

    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        names = self.keys.rank_keys(keys, self.rank)
        rows_view = self.arena.rows
        bad: list[int] = []
        damaged: list[str] = []
        io = False
        why = ""
        for start, rows in self._chunks(len(slots)):
            batch = range(start, start + len(rows))
            status = self.store.get_into([names[i] for i in batch], [self.arena.address(r) for r in rows],
                                         [self.arena.record_bytes] * len(rows))
            for row, i, code in zip(rows, batch, status):
                record = rows_view[row]
                if code != self.arena.record_bytes:
                    bad.append(slots[i])
                    io = io or self.store.unreachable(code)
                    why = why or (f"status {code}" if code < 0 else f"{code}-byte value")
                    continue
                problem = check_record(record, names[i])
                if problem is not None:
                    bad.append(slots[i])
                    damaged.append(names[i])
                    self.num_rejected += 1
                    why = why or problem
                    continue
                np.copyto(np.frombuffer(out[i], dtype=np.uint8), record[HEADER_BYTES:])
        if damaged:
            self.store.remove(damaged)  # else every replica would keep finding and failing on them
        if bad:
            raise BlockTransferError(f"{self.name}: {len(bad)} of {len(slots)} values unusable ({why})", bad, io=io)

    def close(self) -> None:
        self.arena.close()
        self.store.close()
