"""FsTier: the remote ledger of an fs tier, which also keeps the directory's recency
true and reports its fill.

- Recency: evictions keep the records used most recently (by mtime), but a block that every
  request hits (a system prompt) is served by the device or CPU tier and never read from the
  directory, so its record would look cold and go first. The chain touches every tier on a hit;
  here a touch refreshes the records' mtimes, at most once per REFRESH_S per block, on a thread
  of its own (a metadata write each: never on the scheduler's path).
- Fill: what one process has looked up or written is a small part of a directory many processes
  share; the buckets' counts say how full it really is. Reading them costs a file read per
  bucket, so a report reuses them for USAGE_TTL_S.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.tier_report import TierReport
from kvoffload.tiers.fs.bucket import allocated
from kvoffload.tiers.fs.spec import FsLoadStoreSpec
from kvoffload.tiers.fs.store import FsStore
from kvoffload.tiers.store.keys import StoreKeys
from kvoffload.tiers.store.lookups import StoreLookups
from kvoffload.tiers.store.tier import SharedStoreTier

#: How long a reading of the buckets' counts serves reports.
USAGE_TTL_S = 5.0
#: A block hit in any tier has its record's mtime refreshed at most this often.
REFRESH_S = 1.0


class FsTier(SharedStoreTier):
    def __init__(self, store: FsStore, keys: StoreKeys, record_bytes: int, capacity_blocks: int,
                 retry_after_s: float, enable_events: bool = False, block_size: int = 0) -> None:
        super().__init__(FsLoadStoreSpec, StoreLookups(store, keys), capacity_blocks, retry_after_s, name=store.name,
                         enable_events=enable_events, block_size=block_size)
        self.store = store
        self.keys = keys
        self._record = allocated(record_bytes)
        self._usage: tuple[float, int, int] = (-USAGE_TTL_S, 0, 0)  # (read at, bytes used, capacity)
        self._refreshed: OrderedDict[BlockHash, float] = OrderedDict()
        self._toucher = ThreadPoolExecutor(1, thread_name_prefix="kvoffload-fs-touch")

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        hashes = list(block_hashes)
        super().touch(hashes)
        now = time.monotonic()
        due = [h for h in hashes if self.is_ready(h) and now - self._refreshed.get(h, -REFRESH_S) >= REFRESH_S]
        if not due:
            return
        for h in due:
            self._refreshed[h] = now
            self._refreshed.move_to_end(h)
        while len(self._refreshed) > self.capacity_blocks:
            self._refreshed.popitem(last=False)
        self._toucher.submit(self.store.touch, self.keys.all_rank_keys(due))

    def close(self) -> None:
        self._toucher.shutdown(wait=True)
        super().close()

    def report(self) -> TierReport:
        at, used, capacity = self._usage
        now = time.monotonic()
        if now - at >= USAGE_TTL_S:
            used, capacity = self.store.usage()
            self._usage = (now, used, capacity)
        return dataclasses.replace(super().report(), blocks_used=used // self._record,
                                   capacity_blocks=capacity // self._record)
