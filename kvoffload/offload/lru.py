"""LRU: evict the block untouched for the longest time."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import islice

import numpy as np

from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.policy import LedgerCachePolicy
from kvoffload.offload.stamp_order import StampOrder

_LRU_TAG = 1


class LRUCachePolicy(LedgerCachePolicy):
    def _on_bind(self) -> None:
        self.order = StampOrder(self.ledger, _LRU_TAG)

    def insert_slots(self, slots: np.ndarray) -> None:
        self.order.add(slots, self.ledger.next_stamps(len(slots)))

    def remove_slots(self, slots: np.ndarray) -> None:
        self.order.discard(slots)

    def touch_slots(self, slots: np.ndarray, block_hashes: Iterable[BlockHash]) -> None:
        if len(slots):
            self.order.refresh(slots[::-1], self.ledger.next_stamps(len(slots)))

    def evict_slots(self, n: int, protected: Collection[BlockHash]) -> list[int] | None:
        if n <= 0:
            return []
        self.order.compact()
        victims = list(islice(self.order.candidates(protected), n))
        if len(victims) < n:
            return None
        self.order.discard(np.array(victims, dtype=np.int64))
        return victims
