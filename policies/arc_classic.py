"""ARC exactly as Megiddo & Modha (FAST'03) specify it, for page-cache style replay.

Differences from the vLLM variant shipped as ``arc``: a ghost hit is admitted straight to
T2; the adaptation step is fractional (|B2|/|B1| or |B1|/|B2|, at least 1); REPLACE takes
from T1 when |T1| > p, or when |T1| == p and the request is a B2 ghost hit; on a miss the
directory is bounded as in the paper's case IV (|T1|+|B1| == c drops B1's LRU, or T1's LRU
outright when B1 is empty; a full 2c directory drops B2's LRU).

Replay order the policy expects per reference x: ``touch([x])`` (hit promotion or ghost
adaptation), ``lookup``, then on a miss ``evict`` (if full) with ``x`` protected and
``insert(x)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable, Iterable
from itertools import chain

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.policy import CachePolicy

from .base import evictable, has_n_evictable


class ClassicARCCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.p = 0.0
        self.t1: OrderedDict[Hashable, BlockStatus] = OrderedDict()
        self.t2: OrderedDict[Hashable, BlockStatus] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()
        self._ghost_hit: dict[Hashable, str] = {}  # hashes touched while in B1/B2, awaiting insert

    def get(self, h: Hashable) -> BlockStatus | None:
        return self.t1.get(h) or self.t2.get(h)

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        c = self.cache_capacity
        for h in block_hashes:
            if h in self.t1:
                block = self.t1.pop(h)
                (self.t2 if block.ref_cnt >= 0 else self.t1)[h] = block
            elif h in self.t2:
                self.t2.move_to_end(h)
            elif h in self.b1 and h not in self._ghost_hit:
                self.p = min(self.p + max(1.0, len(self.b2) / len(self.b1)), float(c))
                self._ghost_hit[h] = "b1"
            elif h in self.b2 and h not in self._ghost_hit:
                self.p = max(self.p - max(1.0, len(self.b1) / len(self.b2)), 0.0)
                self._ghost_hit[h] = "b2"

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        hit = self._ghost_hit.pop(h, None)
        self.b1.pop(h, None)
        self.b2.pop(h, None)
        (self.t2 if hit else self.t1)[h] = block

    def remove(self, h: Hashable) -> None:
        if self.t1.pop(h, None) is None:
            self.t2.pop(h, None)

    def _replace_from_t1(self, in_b2: bool) -> bool:
        t1 = len(self.t1)
        return t1 >= 1 and ((in_b2 and t1 == self.p) or t1 > self.p)

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if not has_n_evictable(chain(self.t1.items(), self.t2.items()), n, protected):
            return None
        c = self.cache_capacity
        out: list[tuple[Hashable, BlockStatus]] = []
        in_b2 = any(self._ghost_hit.get(h) == "b2" for h in protected)
        is_ghost_hit = any(h in self._ghost_hit for h in protected)
        while len(out) < n:
            if not is_ghost_hit:  # case IV: keep the directory within c and 2c
                if len(self.t1) + len(self.b1) >= c:
                    if self.b1:
                        self.b1.popitem(last=False)
                    else:
                        victim = self._pop_lru(self.t1, protected)
                        if victim is not None:
                            out.append(victim)  # dropped outright, not remembered
                            continue
                elif len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) >= 2 * c and self.b2:
                    self.b2.popitem(last=False)
            first, ghost_first, second, ghost_second = (
                (self.t1, self.b1, self.t2, self.b2) if self._replace_from_t1(in_b2) else (self.t2, self.b2, self.t1, self.b1)
            )
            victim = self._pop_lru(first, protected)
            ghost = ghost_first
            if victim is None:
                victim, ghost = self._pop_lru(second, protected), ghost_second
            assert victim is not None
            ghost[victim[0]] = None
            out.append(victim)
        return out

    @staticmethod
    def _pop_lru(lst: OrderedDict, protected: Collection[Hashable]) -> tuple[Hashable, BlockStatus] | None:
        for h, block in lst.items():
            if evictable(h, block, protected):
                del lst[h]
                return h, block
        return None
