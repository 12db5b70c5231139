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
from kvoffload.offload.policy import OfflinePolicy

from .base import evictable, has_n_evictable

NEVER = math.inf


class BeladyCachePolicy(OfflinePolicy):
    """A block's rank is one int, -(next use x M + depth) with M above every request's length
    (no next use: the request count), so the heap's smallest entry ``(rank, seq, hash)`` is the
    block needed farthest away, deepest first, oldest push first. ``live[h]`` is h's one current
    heap entry itself (one dict probe per reference finds both the block and its rank); older
    entries are skipped when popped and dropped in bulk once they outnumber the live ones."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.blocks: dict[Hashable, BlockStatus] = {}
        self.live: dict[Hashable, tuple[int, int, Hashable]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._ranks: list[dict[Hashable, int]] = []
        self._scale = 1  # M
        self._never = 0  # the request count: "no next use"
        self._never_rank = 0  # the rank of a block with no next use, at depth 0
        self._now = 0
        self._seq = 0

    def set_future(self, future: Sequence[Sequence[Hashable]]) -> None:
        """``future[r]`` = the block hashes request r references, in prefix order. Precomputes,
        once per trace, the rank of every reference."""
        never, scale = len(future), max(map(len, future), default=0) + 1
        ranks: list[dict[Hashable, int]] = [{} for _ in future]
        last: dict[Hashable, int] = {}
        for r in range(len(future) - 1, -1, -1):
            ranks_r = ranks[r]
            for d, h in enumerate(future[r]):
                ranks_r[h] = -(last.get(h, never) * scale + d)
            for h in future[r]:
                last[h] = r
        self._ranks, self._scale, self._never, self._never_rank = ranks, scale, never, -never * scale

    def advance(self, request_index: int) -> None:
        self._now = request_index

    def _current(self) -> dict[Hashable, int]:
        r = self._now
        return self._ranks[r] if r < len(self._ranks) else {}

    def _next_of(self, rank: int) -> float:
        nxt = -rank // self._scale
        return NEVER if nxt >= self._never else nxt

    def _rank_now(self, h: Hashable) -> int:
        return self._current().get(h, self._never_rank)

    def _next_use(self, h: Hashable) -> float:
        return self._next_of(self._rank_now(h))

    def _push(self, h: Hashable, rank: int) -> None:
        self._seq += 1
        self.live[h] = entry = (rank, self._seq, h)
        heapq.heappush(self._heap, entry)

    def admit(self, h: Hashable) -> bool:
        """Worth storing? False when every cached block is needed sooner (bypass)."""
        if len(self.blocks) < self.cache_capacity:
            return self._next_use(h) != NEVER
        farthest = self._peek_farthest()
        return farthest is None or self._next_use(h) < farthest

    def _peek_farthest(self) -> float | None:
        heap, live = self._heap, self.live
        while heap:
            entry = heap[0]
            if live.get(entry[2]) is entry:
                return self._next_of(entry[0])
            heapq.heappop(heap)
        return None

    def get(self, h: Hashable) -> BlockStatus | None:
        return self.blocks.get(h)

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        self.blocks[h] = block
        self._push(h, self._rank_now(h))

    def remove(self, h: Hashable) -> None:
        if self.blocks.pop(h, None) is not None:
            del self.live[h]

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        # _push inlined (this loop runs once per block reference of a replay), and no push when
        # the rank is unchanged (a block touched twice in one request): its live entry already
        # ranks it. A block's rank never returns to an earlier value (its next use moves on).
        unknown = self._never_rank
        live, heap, push, rank_of = self.live, self._heap, heapq.heappush, self._current().get
        seq = self._seq
        for h in block_hashes:
            entry = live.get(h)  # cached blocks only
            if entry is not None:
                k = rank_of(h, unknown)
                if entry[0] != k:
                    seq += 1
                    live[h] = entry = (k, seq, h)
                    push(heap, entry)
        self._seq = seq
        if len(heap) > 8 * len(live) + 1024:
            self._compact()

    def _compact(self) -> None:
        """Drop stale entries once they outnumber live ones 7:1: pushes stay O(log capacity)
        and each compaction's pass is paid for by the many pushes before it."""
        live = self.live
        self._heap = [e for e in self._heap if live.get(e[2]) is e]
        heapq.heapify(self._heap)

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if not has_n_evictable(self.blocks.items(), n, protected):
            return None
        out: list[tuple[Hashable, BlockStatus]] = []
        skipped = []
        heap, live = self._heap, self.live
        while len(out) < n:
            entry = heapq.heappop(heap)
            h = entry[2]
            if live.get(h) is not entry:
                continue
            if not evictable(h, self.blocks[h], protected):
                skipped.append(entry)
                continue
            out.append((h, self.blocks.pop(h)))
            del live[h]
        for entry in skipped:
            heapq.heappush(heap, entry)
        return out
