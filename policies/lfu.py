"""LFU with aging: evict the least frequently touched block (least recent among ties);
every ``cache_capacity`` touches all counts are halved, so past popularity fades."""

from __future__ import annotations

import heapq
import itertools
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
        self._heap: list[tuple[int, int, Hashable]] = []
        self._clock = itertools.count()
        self._touches = 0

    def _push(self, h: Hashable) -> None:
        t = next(self._clock)
        self.tick[h] = t
        heapq.heappush(self._heap, (self.freq[h], t, h))

    def get(self, h: Hashable) -> BlockStatus | None:
        return self.blocks.get(h)

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        self.blocks[h] = block
        self.freq[h] = 1
        self._push(h)

    def remove(self, h: Hashable) -> None:
        if self.blocks.pop(h, None) is not None:
            del self.freq[h], self.tick[h]

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        # _push inlined: this loop runs once per block reference of a replay.
        blocks, freq, tick, heap, clock, push = self.blocks, self.freq, self.tick, self._heap, self._clock, heapq.heappush
        touched = 0
        for h in block_hashes:
            if h in blocks:
                f = freq[h] + 1
                freq[h] = f
                t = next(clock)
                tick[h] = t
                push(heap, (f, t, h))
                touched += 1
        self._touches += touched
        if self._touches >= self.cache_capacity:
            self._touches = 0
            self.freq = freq = {h: (f >> 1) or 1 for h, f in freq.items()}  # halve, floor 1
            self._heap = [(freq[h], tick[h], h) for h in blocks]
            heapq.heapify(self._heap)

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if not has_n_evictable(self.blocks.items(), n, protected):
            return None
        out: list[tuple[Hashable, BlockStatus]] = []
        skipped: list[tuple[int, int, Hashable]] = []
        while len(out) < n:
            f, t, h = heapq.heappop(self._heap)
            if h not in self.blocks or self.freq[h] != f or self.tick[h] != t:
                continue  # stale entry
            if not evictable(h, self.blocks[h], protected):
                skipped.append((f, t, h))
                continue
            out.append((h, self.blocks.pop(h)))
            del self.freq[h], self.tick[h]
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return out
