"""A recency list over ledger slots, kept as stamps instead of links.

Touching or inserting a block is one vectorised stamp assignment; the least-recent end is
materialised lazily as a sorted queue of (slot, stamp) that covers every member whose stamp
is <= the queue's horizon. A queue entry is stale once its slot's stamp or tag changed (the
block was touched, moved or freed); stale entries are skipped and never become valid again,
because stamps only grow. Members beyond the horizon are sorted in when a scan needs them.
"""

from __future__ import annotations

from collections.abc import Container, Iterator

import numpy as np

from kvoffload.offload.block_status import FREE_TAG, BlockLedger

_CHUNK = 64


class StampOrder:
    def __init__(self, ledger: BlockLedger, tag: int) -> None:
        self.ledger = ledger
        self.tag = tag
        self.size = 0
        self._queue = np.empty(0, dtype=np.int64)
        self._qstamp = np.empty(0, dtype=np.int64)
        self._pos = 0
        self._horizon = 0
        self._batch = max(4096, ledger.capacity // 64)

    def add(self, slots: np.ndarray, stamps: np.ndarray) -> None:
        """Make ``slots`` (not members yet) members, most recent last."""
        self.ledger.tag[slots] = self.tag
        self.ledger.stamp[slots] = stamps
        self.size += len(slots)

    def refresh(self, slots: np.ndarray, stamps: np.ndarray) -> None:
        self.ledger.stamp[slots] = stamps

    def discard(self, slots: np.ndarray) -> None:
        self.ledger.tag[slots] = FREE_TAG
        self.size -= len(slots)

    def clear(self) -> None:
        members = np.flatnonzero(self.ledger.tag == self.tag)
        self.ledger.tag[members] = FREE_TAG
        self.size = 0
        self._queue = self._qstamp = np.empty(0, dtype=np.int64)
        self._pos = 0

    def oldest_first(self) -> np.ndarray:
        """Every member slot, least recent first (for inspection and tests; O(n log n))."""
        members = np.flatnonzero(self.ledger.tag == self.tag)
        return members[np.argsort(self.ledger.stamp[members], kind="stable")]

    def compact(self) -> None:
        """Drop the consumed prefix of the queue; call only while no scan is running."""
        if self._pos:
            self._queue = self._queue[self._pos :]
            self._qstamp = self._qstamp[self._pos :]
            self._pos = 0

    def _extend(self) -> bool:
        ledger = self.ledger
        members = np.flatnonzero(ledger.tag == self.tag)
        stamps = ledger.stamp[members]
        beyond = stamps > self._horizon
        members, stamps = members[beyond], stamps[beyond]
        if len(members) == 0:
            return False
        if len(members) > self._batch:
            keep = np.argpartition(stamps, self._batch - 1)[: self._batch]
            members, stamps = members[keep], stamps[keep]
        order = np.argsort(stamps, kind="stable")
        self._queue = np.concatenate((self._queue, members[order]))
        self._qstamp = np.concatenate((self._qstamp, stamps[order]))
        self._horizon = int(self._qstamp[-1])
        return True

    def candidates(self, protected: Container | None = None) -> Iterator[int]:
        """Evictable members (ref_cnt 0, hash not protected), least recent first."""
        ledger = self.ledger
        i = self._pos
        while True:
            if i >= len(self._queue) and not self._extend():
                return
            j = min(i + _CHUNK, len(self._queue))
            slots = self._queue[i:j]
            valid = (ledger.tag[slots] == self.tag) & (ledger.stamp[slots] == self._qstamp[i:j])
            if i == self._pos:
                self._pos = j if not valid.any() else i + int(np.argmax(valid))
            ok = slots[valid & (ledger.ref_cnt[slots] == 0)]
            hashes = ledger.hashes
            for slot in ok.tolist():
                if protected and hashes[slot] in protected:
                    continue
                yield slot
            i = j
