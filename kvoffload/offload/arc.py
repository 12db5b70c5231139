"""ARC (Megiddo & Modha), in the variant vLLM ships for offloaded KV blocks.

T1 holds blocks seen once, T2 blocks touched again while ready; B1/B2 remember only the
hashes recently evicted from T1/T2. A ghost hit moves ``target_t1_size`` (B1 up, B2 down);
eviction drains T1 while it is at or above the target and falls back to the other list when
the preferred one has no evictable block. Ghost lists are bounded by the capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

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

    def insert_slots(self, slots: list[int]) -> None:
        self.t1.add(slots)
        hashes = self.ledger.hashes
        b1_pop, b2_pop = self.b1.pop, self.b2.pop
        for slot in slots:
            h = hashes[slot]
            b1_pop(h, None)
            b2_pop(h, None)

    def remove_slots(self, slots: list[int]) -> None:
        tags = self.ledger.tags
        self.t1.discard([s for s in slots if tags[s] == _T1])
        self.t2.discard([s for s in slots if tags[s] == _T2])

    def touch_hashes(self, block_hashes: list[BlockHash]) -> None:
        ledger = self.ledger
        index_get = ledger.index.get
        tags, stamps, refs = ledger.tags, ledger.stamps, ledger.refs
        clock = ledger.clock
        b1, b2 = self.b1, self.b2
        promoted = 0
        for h in reversed(block_hashes):
            slot = index_get(h)
            if slot is not None:
                if tags[slot] == _T1 and refs[slot] >= 0:
                    tags[slot] = _T2
                    promoted += 1
                stamps[slot] = clock
                clock += 1
            elif h in b1:
                delta = max(1.0, len(b2) / len(b1))
                self.target_t1_size = min(self.target_t1_size + delta, float(self.cache_capacity))
                b1.move_to_end(h)
            elif h in b2:
                delta = max(1.0, len(b1) / len(b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0.0)
                b2.move_to_end(h)
        ledger.clock = clock
        self.t1.size -= promoted
        self.t2.size += promoted

    def refresh_hashes(self, block_hashes: list[BlockHash]) -> None:
        """Most recent within its own list (T1 stays T1): an insertion is not a reuse."""
        self.ledger.restamp(block_hashes)

    def evict_slots(self, n: int, protected: Collection[BlockHash]) -> list[int] | None:
        if n <= 0:
            return []
        self.t1.compact()
        self.t2.compact()
        # Collect only what the selection below can take: T1 first while it is at or above the
        # target, then T2, then T1 again if T2 ran short (collect(k) is a prefix of collect(n)).
        want1 = min(n, max(0, self.t1.size - int(self.target_t1_size) + 1))
        c1 = self.t1.collect(want1, protected) if want1 else []
        k1 = len(c1)
        c2 = self.t2.collect(n - k1, protected) if n > k1 else []
        if k1 + len(c2) < n:
            c1 = self.t1.collect(n - len(c2), protected)
            if len(c1) + len(c2) < n:
                return None
        # T1 victims are c1 (the leading k1 preferred, the rest fallbacks), T2 victims c2.
        self.t1.discard(c1)
        self.t2.discard(c2)
        hashes = self.ledger.hashes
        for ghost, victims in ((self.b1, c1), (self.b2, c2)):
            for slot in victims:
                ghost[hashes[slot]] = None
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return c1[:k1] + c2 + c1[k1:]
