"""LFU with aging: evict the least frequently touched block (least recent among ties);
every ``cache_capacity`` touches all counts are halved, so past popularity fades.

The heap is re-keyed lazily: a touch only raises a block's (count, tick), so its one heap entry
can only rank it too early. Eviction pops the smallest entry and, if the block moved on since,
pushes it back with its current key; the first entry popped that is current is the true
minimum. A touch is then two dict writes, not a heap push (a replay's per-reference cost)."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Hashable, Iterable

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.policy import CachePolicy

from .base import evictable, has_n_evictable


class LFUCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.blocks: dict[Hashable, BlockStatus] = {}
        self.freq: dict[Hashable, int] = {}
        self.tick: dict[Hashable, int] = {}
        #: The tick of each block's one heap entry (orphaned entries of removed blocks differ).
        self.entry_tick: dict[Hashable, int] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._clock = 0
        self._touches = 0

    def _push(self, h: Hashable) -> None:
        self._clock = t = self._clock + 1
        self.tick[h] = self.entry_tick[h] = t
        heapq.heappush(self._heap, (self.freq[h], t, h))

    def get(self, h: Hashable) -> BlockStatus | None:
        return self.blocks.get(h)

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        self.blocks[h] = block
        self.freq[h] = 1
        self._push(h)

    def remove(self, h: Hashable) -> None:
        if self.blocks.pop(h, None) is not None:
            del self.freq[h], self.tick[h], self.entry_tick[h]

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        freq, tick, t = self.freq, self.tick, self._clock
        for h in block_hashes:
            f = freq.get(h)  # cached blocks only
            if f is not None:
                freq[h] = f + 1
                t += 1
                tick[h] = t
        self._touches += t - self._clock  # one tick per cached block touched
        self._clock = t
        if self._touches >= self.cache_capacity:
            # Halving (floor 1) can reorder blocks: rebuild the heap with every current key.
            self._touches = 0
            # freq and tick hold the same keys in the same order (set and deleted together, and
            # the halving keeps freq's order), so their values zip into the heap's entries.
            self.freq = freq = {h: (f >> 1) or 1 for h, f in freq.items()}
            self._heap = list(zip(freq.values(), tick.values(), freq))
            heapq.heapify(self._heap)
            self.entry_tick = tick.copy()

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if not has_n_evictable(self.blocks.items(), n, protected):
            return None
        out: list[tuple[Hashable, BlockStatus]] = []
        skipped: list[tuple[int, int, Hashable]] = []
        heap, freq, tick, entry_tick = self._heap, self.freq, self.tick, self.entry_tick
        while len(out) < n:
            f, t, h = heapq.heappop(heap)
            if entry_tick.get(h) != t:
                continue  # an orphan: its block was removed (and perhaps stored again since)
            if freq[h] != f or tick[h] != t:  # touched since: back in at its current key
                entry_tick[h] = tick[h]
                heapq.heappush(heap, (freq[h], tick[h], h))
                continue
            if not evictable(h, self.blocks[h], protected):
                skipped.append((f, t, h))
                continue
            out.append((h, self.blocks.pop(h)))
            del freq[h], tick[h], entry_tick[h]
        for entry in skipped:
            heapq.heappush(heap, entry)
        return out
