"""LRU: evict the block untouched for the longest time."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.policy import LedgerCachePolicy
from kvoffload.offload.stamp_order import StampOrder

_LRU_TAG = 1
_VECTOR_MIN = 48  # touches longer than this assign stamps with numpy


class LRUCachePolicy(LedgerCachePolicy):
    def _on_bind(self) -> None:
        self.order = StampOrder(self.ledger, _LRU_TAG)

    def insert_slots(self, slots: list[int]) -> None:
        self.order.add(slots)

    def remove_slots(self, slots: list[int]) -> None:
        self.order.discard(slots)

    def touch_hashes(self, block_hashes: list[BlockHash]) -> None:
        ledger = self.ledger
        index_get = ledger.index.get
        if len(block_hashes) > _VECTOR_MIN:
            slots = [s for s in map(index_get, reversed(block_hashes)) if s is not None]
            if slots:
                # Later writes win, so the earliest occurrence of a hash gets the newest stamp.
                ledger.stamp[np.fromiter(slots, np.int64, len(slots))] = ledger.clock + np.arange(len(slots))
                ledger.clock += len(slots)
            return
        stamps = ledger.stamps
        clock = ledger.clock
        for block_hash in reversed(block_hashes):
            slot = index_get(block_hash)
            if slot is not None:
                stamps[slot] = clock
                clock += 1
        ledger.clock = clock

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
