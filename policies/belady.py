"""Belady's MIN: evict the block whose next use lies farthest in the future (offline oracle).

The simulator hands it the whole request sequence (``set_future``) and the index of the
request being served (``advance``). Ties — blocks never used again, or next used by the same
request — evict the deepest block of a prefix first. ``admit`` lets the simulator skip
storing a block whose next use is farther away than every cached block's (MIN with
bypass, exactly optimal when blocks are independent). An upper bound, not a deployable policy.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Hashable, Iterable, Sequence

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.policy import CachePolicy

from .base import evictable, has_n_evictable

NEVER = math.inf


class BeladyCachePolicy(CachePolicy):
    #: Offline only: it ranks blocks by their next use, known from a recorded trace.
    needs_future = True

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.blocks: dict[Hashable, BlockStatus] = {}
        self.key: dict[Hashable, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, int, Hashable]] = []
        self._next: list[dict[Hashable, float]] = []
        self._depth: list[dict[Hashable, int]] = []
        self._now = 0
        self._seq = 0

    def set_future(self, future: Sequence[Sequence[Hashable]]) -> None:
        """``future[r]`` = the block hashes request r references, in prefix order."""
        nxt: list[dict[Hashable, float]] = [{} for _ in future]
        depth: list[dict[Hashable, int]] = [{} for _ in future]
        last: dict[Hashable, float] = {}
        for r in range(len(future) - 1, -1, -1):
            for d, h in enumerate(future[r]):
                nxt[r][h] = last.get(h, NEVER)
                depth[r][h] = d
            for h in future[r]:
                last[h] = r
        self._next, self._depth = nxt, depth

    def advance(self, request_index: int) -> None:
        self._now = request_index

    def _next_use(self, h: Hashable) -> tuple[float, int]:
        r = self._now
        if r < len(self._next) and h in self._next[r]:
            return self._next[r][h], self._depth[r][h]
        return NEVER, 0

    def _refresh(self, h: Hashable) -> None:
        key = self._next_use(h)
        self.key[h] = key
        self._seq += 1
        heapq.heappush(self._heap, (-key[0], -key[1], self._seq, h))

    def admit(self, h: Hashable) -> bool:
        """Worth storing? False when every cached block is needed sooner (bypass)."""
        if len(self.blocks) < self.cache_capacity:
            return self._next_use(h)[0] != NEVER
        farthest = self._peek_farthest()
        return farthest is None or self._next_use(h)[0] < farthest

    def _peek_farthest(self) -> float | None:
        while self._heap:
            neg_next, neg_depth, _, h = self._heap[0]
            if h in self.blocks and self.key[h] == (-neg_next, -neg_depth):
                return -neg_next
            heapq.heappop(self._heap)
        return None

    def get(self, h: Hashable) -> BlockStatus | None:
        return self.blocks.get(h)

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        self.blocks[h] = block
        self._refresh(h)

    def remove(self, h: Hashable) -> None:
        self.blocks.pop(h, None)
        self.key.pop(h, None)

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        for h in block_hashes:
            if h in self.blocks:
                self._refresh(h)

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if not has_n_evictable(self.blocks.items(), n, protected):
            return None
        out: list[tuple[Hashable, BlockStatus]] = []
        skipped = []
        while len(out) < n:
            entry = heapq.heappop(self._heap)
            neg_next, neg_depth, _, h = entry
            if h not in self.blocks or self.key[h] != (-neg_next, -neg_depth):
                continue
            if not evictable(h, self.blocks[h], protected):
                skipped.append(entry)
                continue
            out.append((h, self.blocks.pop(h)))
            del self.key[h]
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return out
