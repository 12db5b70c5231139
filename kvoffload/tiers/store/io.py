"""StoreIO: a TierIO over a shared key-value store, for this rank's shard of each block.

Each value is a 64-byte header (key, checksum) and the block. Where the store can reach the
block's memory (TCP: any host memory; RDMA: memory registered once, like the host tier's
buffer), a batch goes in one call straight from and into the blocks, the headers alone in
registered staging memory; elsewhere each block is staged next to its header. Reads check
every value's key and checksum before it is used. The slot ids the handler passes only
pair blocks with keys; the store is addressed by key.

Errors split the way the scheduler needs them: a store that cannot be reached (RPC or
transfer failure) is an I/O error and counts against the tier's health; a value that is gone
(evicted by the store), torn or of another key is bad data: dropped and recomputed.

A store that took SLOW_FAILURE_S or more to answer "unreachable" is not called again for
``unreachable_hold_s``: each call to a dead Mooncake master waits out its client's RPC timeout
(about 4 s), so the rest of a job, and each job queued before the scheduler took the tier out of
service, would hold its lane that long. They fail at once instead, as I/O errors; the first call
after the hold finds out whether the store is back. A quick failure (a dropped connection) holds
nothing: asking again costs nothing, and the scheduler's health decides on outages.
"""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np

from kvoffload.auth import RecordTagger
from kvoffload.offload.abstract import BlockHash
from kvoffload.tiers.store.keys import StoreKeys
from kvoffload.tiers.store.kv_store import KeyValueStore
from kvoffload.tiers.store.record import HEADER_BYTES, check_header, make_header, write_header
from kvoffload.tiers.store.staging import StagingArena
from kvoffload.transfer.result import BlockTransferError
from kvoffload.transfer.tier_io import TierIO


def _address(view: memoryview) -> int:
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))  # a writable buffer: cheap
    except TypeError:
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class StoreIO(TierIO):
    #: An "unreachable" answer this slow was a timeout: the next call would wait as long.
    SLOW_FAILURE_S = 0.5

    def __init__(self, store: KeyValueStore, keys: StoreKeys, rank: int, block_bytes: int, staging_bytes: int,
                 tagger: RecordTagger | None = None, unreachable_hold_s: float = 0.0) -> None:
        """``unreachable_hold_s``: 0 calls the store every time (a filesystem, whose errors are
        per file); a networked store passes its tier's ``retry_after_s``."""
        self.name = store.name
        self.tagger = tagger or RecordTagger()
        self.store = store
        self.keys = keys
        self.rank = rank
        self.block_bytes = block_bytes
        self.arena = StagingArena(store, HEADER_BYTES + block_bytes, staging_bytes)
        self._regions: list[tuple[int, int]] = []  # registered memory the store copies directly
        self.num_rejected = 0
        self.num_direct = self.num_staged = 0
        self.unreachable_hold_s = unreachable_hold_s
        self._held_until = 0.0  # monotonic: the store is not called before then
        #: Blocks failed without a call, the store being held unreachable.
        self.num_held = 0

    def _held(self) -> bool:
        return time.monotonic() < self._held_until  # only _hold sets it, and only with a hold

    def _hold(self, called_at: float) -> None:
        """An unreachable answer to a call made at ``called_at``: hold the store if it was slow."""
        now = time.monotonic()
        if self.unreachable_hold_s > 0 and now - called_at >= self.SLOW_FAILURE_S:
            self._held_until = now + self.unreachable_hold_s

    def _why_held(self, held: int) -> str:
        self.num_held += held
        return f"; {held} without a call, the store being unreachable" if held else ""

    def register_memory(self, ptr: int, nbytes: int) -> None:
        self.store.register(ptr, nbytes)
        self._regions.append((ptr, ptr + nbytes))

    def _direct(self, views: Sequence[memoryview]) -> list[int] | None:
        """The blocks' addresses when the store can copy them in place (else None: stage them)."""
        addrs = [_address(v) for v in views]
        if self.store.needs_registration and not all(
                any(lo <= a and a + self.block_bytes <= hi for lo, hi in self._regions) for a in addrs):
            return None
        return addrs

    def _chunks(self, n: int) -> Iterator[tuple[range, list[int]]]:
        """(blocks, arena rows) pairs covering n blocks, as many at a time as the arena lends."""
        start = 0
        while start < n:
            rows = self.arena.take(n - start)
            try:
                yield range(start, start + len(rows)), rows
            finally:
                self.arena.give_back(rows)
            start += len(rows)

    # ---- writes --------------------------------------------------------------------------
    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        names = self.keys.rank_keys(keys, self.rank)
        addrs = self._direct(blocks)
        records = self.arena.rows
        failed: list[int] = []
        io = False
        held = 0
        for batch, rows in self._chunks(len(blocks)):
            if self._held():
                failed += [slots[i] for i in batch]
                io, held = True, held + len(batch)
                continue
            batch_names = [names[i] for i in batch]
            if addrs is not None:  # header from the arena, the block from where it lies
                headers = b"".join([make_header(names[i], blocks[i], self.tagger) for i in batch])
                records[rows, :HEADER_BYTES] = np.frombuffer(headers, dtype=np.uint8).reshape(len(rows), HEADER_BYTES)
                called_at = time.monotonic()  # the store's own time: a batch's tags are not its slowness
                status = self.store.put_from_parts(
                    batch_names, [[self.arena.address(r), addrs[i]] for r, i in zip(rows, batch)],
                    [[HEADER_BYTES, self.block_bytes]] * len(rows))
            else:  # the block copied next to its header, in registered memory
                for row, i in zip(rows, batch):
                    records[row, HEADER_BYTES:] = np.frombuffer(blocks[i], dtype=np.uint8)
                    write_header(records[row], names[i], self.tagger)
                called_at = time.monotonic()
                status = self.store.put_from(batch_names, [self.arena.address(r) for r in rows],
                                             [self.arena.record_bytes] * len(rows))
            for i, code in zip(batch, status):
                if code < 0:
                    failed.append(slots[i])
                    if self.store.unreachable(code):
                        io = True
                        self._hold(called_at)
        if addrs is not None:
            self.num_direct += len(blocks)
        else:
            self.num_staged += len(blocks)
        if failed:
            raise BlockTransferError(f"{self.name}: {len(failed)} of {len(blocks)} values not stored"
                                     f"{self._why_held(held)}", failed, io=io)

    # ---- reads ---------------------------------------------------------------------------
    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        names = self.keys.rank_keys(keys, self.rank)
        addrs = self._direct(out)
        records = self.arena.rows
        bad: list[int] = []
        damaged: list[str] = []
        reasons: Counter[str] = Counter()
        io = False
        why = ""
        held = 0
        for batch, rows in self._chunks(len(slots)):
            if self._held():
                bad += [slots[i] for i in batch]
                io, held = True, held + len(batch)
                why = why or "unreachable"
                continue
            batch_names = [names[i] for i in batch]
            called_at = time.monotonic()
            if addrs is not None:  # header into the arena, the block straight into ``out``
                status = self.store.get_into_parts(
                    batch_names, [[self.arena.address(r), addrs[i]] for r, i in zip(rows, batch)],
                    [[HEADER_BYTES, self.block_bytes]] * len(rows))
            else:
                status = self.store.get_into(batch_names, [self.arena.address(r) for r in rows],
                                             [self.arena.record_bytes] * len(rows))
            for row, i, code in zip(rows, batch, status):
                if code != self.arena.record_bytes:
                    bad.append(slots[i])
                    unreachable = self.store.unreachable(code)
                    if unreachable:
                        io = True
                        self._hold(called_at)
                    else:
                        reasons["missing" if code < 0 else "format"] += 1
                    why = why or (f"status {code}" if code < 0 else f"{code}-byte value")
                    continue
                payload = out[i] if addrs is not None else records[row, HEADER_BYTES:].data
                problem = check_header(records[row, :HEADER_BYTES].tobytes(), payload, names[i], self.tagger)
                if problem is not None:
                    bad.append(slots[i])
                    damaged.append(names[i])
                    self.num_rejected += 1
                    reasons[problem[0]] += 1
                    why = why or problem[1]
                elif addrs is None:
                    np.copyto(np.frombuffer(out[i], dtype=np.uint8), records[row, HEADER_BYTES:])
        if damaged:
            self.store.remove(damaged)  # else every replica would keep finding and failing on them
        if bad:
            raise BlockTransferError(f"{self.name}: {len(bad)} of {len(slots)} values unusable ({why})"
                                     f"{self._why_held(held)}", bad, io=io, reasons=dict(reasons))

    def close_memory(self) -> None:
        """Unregister the staging memory and every registered region (the store stays open)."""
        for ptr, _ in self._regions:
            self.store.unregister(ptr)
        self._regions.clear()
        self.arena.close()

    def close(self) -> None:
        self.close_memory()
        self.store.close()
