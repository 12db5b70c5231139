"""S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO, a ghost FIFO.

New blocks enter S (10% of capacity) unless their hash is in the ghost G, then M. Evicting
from S moves a block that was touched while in S to M, else drops it into G; evicting from M
reinserts touched blocks (frequency decremented, capped at 3) and drops the rest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable, Iterable
from itertools import chain

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.policy import CachePolicy

from .base import evictable, has_n_evictable


class S3FIFOCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int, small_ratio: float = 0.1) -> None:
        super().__init__(cache_capacity)
        self.small_target = max(1, int(cache_capacity * small_ratio))
        self.small: OrderedDict[Hashable, BlockStatus] = OrderedDict()
        self.main: OrderedDict[Hashable, BlockStatus] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.freq: dict[Hashable, int] = {}

    def get(self, h: Hashable) -> BlockStatus | None:
        return self.small.get(h) or self.main.get(h)

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        if h in self.ghost:
            del self.ghost[h]
            self.main[h] = block
        else:
            self.small[h] = block
        self.freq[h] = 0

    def remove(self, h: Hashable) -> None:
        if self.small.pop(h, None) is None:
            self.main.pop(h, None)
        self.freq.pop(h, None)

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        for h in block_hashes:
            if h in self.freq:
                self.freq[h] = min(self.freq[h] + 1, 3)

    def _ghost_add(self, h: Hashable) -> None:
        self.ghost[h] = None
        while len(self.ghost) > self.cache_capacity - self.small_target:
            self.ghost.popitem(last=False)

    def _from_small(self, protected: Collection[Hashable]) -> tuple[Hashable, BlockStatus] | None:
        for h, block in list(self.small.items()):
            if not evictable(h, block, protected):
                continue
            del self.small[h]
            if self.freq[h] > 0:
                self.main[h] = block  # promoted: touched while on probation
                self.freq[h] = 0
                continue
            self._ghost_add(h)
            return h, block
        return None

    def _from_main(self, protected: Collection[Hashable]) -> tuple[Hashable, BlockStatus] | None:
        for _ in range(4 * len(self.main) + 1):  # each block's count drops at most 3 times
            if not self.main:
                return None
            h, block = next(iter(self.main.items()))
            if not evictable(h, block, protected):
                self.main.move_to_end(h)
                continue
            if self.freq[h] > 0:
                self.freq[h] -= 1
                self.main.move_to_end(h)
                continue
            return h, self.main.pop(h)
        return None

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if n > 0 and not has_n_evictable(chain(self.small.items(), self.main.items()), n, protected):
            return None
        out: list[tuple[Hashable, BlockStatus]] = []
        while len(out) < n:
            prefer_small = len(self.small) >= self.small_target or not self.main
            first, second = (self._from_small, self._from_main) if prefer_small else (self._from_main, self._from_small)
            victim = first(protected) or second(protected) or self._from_main(protected)
            assert victim is not None, "an evictable block existed but none was found"
            self.freq.pop(victim[0], None)
            out.append(victim)
        return out
