"""LRU: evict the block untouched for the longest time."""

from __future__ import annotations

from collections.abc import Collection

from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.policy import LedgerCachePolicy
from kvoffload.offload.stamp_order import StampOrder

_LRU_TAG = 1


class LRUCachePolicy(LedgerCachePolicy):
    def _on_bind(self) -> None:
        self.order = StampOrder(self.ledger, _LRU_TAG)

    def insert_slots(self, slots: list[int]) -> None:
        self.order.add(slots)

    def remove_slots(self, slots: list[int]) -> None:
        self.order.discard(slots)

    def touch_hashes(self, block_hashes: list[BlockHash]) -> None:
        self.ledger.restamp(block_hashes)

    def refresh_hashes(self, block_hashes: list[BlockHash]) -> None:
        self.touch_hashes(block_hashes)  # LRU has only recency

    def evict_slots(self, n: int, protected: Collection[BlockHash]) -> list[int] | None:
        if n <= 0:
            return []
        self.order.compact()
        victims = self.order.collect(n, protected)
        if len(victims) < n:
            return None
        self.order.discard(victims)
        return victims
