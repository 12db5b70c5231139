"""ARC (Megiddo & Modha), in the variant vLLM ships for offloaded KV blocks.

T1 holds blocks seen once, T2 blocks touched again while ready; B1/B2 remember only the
hashes recently evicted from T1/T2. A ghost hit moves ``target_t1_size`` (B1 up, B2 down);
eviction drains T1 while it is at or above the target and falls back to the other list when
the preferred one has no evictable block. Ghost lists are bounded by the capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

import numpy as np

from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.policy import LedgerCachePolicy
from kvoffload.offload.stamp_order import StampOrder

_T1, _T2 = 1, 2


class ARCCachePolicy(LedgerCachePolicy):
    def _on_bind(self) -> None:
        self.t1 = StampOrder(self.ledger, _T1)
        self.t2 = StampOrder(self.ledger, _T2)
        self.b1: OrderedDict[BlockHash, None] = OrderedDict()
        self.b2: OrderedDict[BlockHash, None] = OrderedDict()
        self.target_t1_size = 0.0

    def num_ghosts(self) -> int:
        return len(self.b1) + len(self.b2)

    def insert_slots(self, slots: np.ndarray) -> None:
        self.t1.add(slots, self.ledger.next_stamps(len(slots)))
        hashes = self.ledger.hashes
        for slot in slots.tolist():
            h = hashes[slot]
            self.b1.pop(h, None)
            self.b2.pop(h, None)

    def remove_slots(self, slots: np.ndarray) -> None:
        tags = self.ledger.tag[slots]
        self.t1.discard(slots[tags == _T1])
        self.t2.discard(slots[tags == _T2])

    def touch_slots(self, slots: np.ndarray, block_hashes: Iterable[BlockHash]) -> None:
        ledger = self.ledger
        if len(slots):
            rev = slots[::-1]
            stamps = ledger.next_stamps(len(rev))
            promote = (ledger.tag[rev] == _T1) & (ledger.ref_cnt[rev] >= 0)
            if promote.any():
                self.t1.discard(rev[promote])
                self.t2.add(rev[promote], stamps[promote])
            ledger.stamp[rev[~promote]] = stamps[~promote]
        index = ledger.index
        for h in reversed(list(block_hashes)):
            if h in index:
                continue
            if h in self.b1:
                delta = max(1.0, len(self.b2) / len(self.b1))
                self.target_t1_size = min(self.target_t1_size + delta, float(self.cache_capacity))
                self.b1.move_to_end(h)
            elif h in self.b2:
                delta = max(1.0, len(self.b1) / len(self.b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0.0)
                self.b2.move_to_end(h)

    def evict_slots(self, n: int, protected: Collection[BlockHash]) -> list[int] | None:
        if n <= 0:
            return []
        self.t1.compact()
        self.t2.compact()
        t1_iter = self.t1.candidates(protected)
        t2_iter = self.t2.candidates(protected)
        chosen: list[tuple[int, bool]] = []  # (slot, from T1) in selection order
        virtual_t1 = self.t1.size
        for _ in range(n):
            slot = next(t1_iter, None) if virtual_t1 >= int(self.target_t1_size) else None
            from_t1 = slot is not None
            if slot is None:
                slot = next(t2_iter, None)
            if slot is None:
                slot = next(t1_iter, None)
                from_t1 = True
            if slot is None:
                return None
            chosen.append((slot, from_t1))
            virtual_t1 -= from_t1
        self.t1.discard(np.array([s for s, t1 in chosen if t1], dtype=np.int64))
        self.t2.discard(np.array([s for s, t1 in chosen if not t1], dtype=np.int64))
        hashes = self.ledger.hashes
        for slot, from_t1 in chosen:
            (self.b1 if from_t1 else self.b2)[hashes[slot]] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return [slot for slot, _ in chosen]
