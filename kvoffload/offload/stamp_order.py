"""A recency list over ledger slots, kept as stamps instead of links.

Touching or inserting a block writes one stamp (no unlinking); the least-recent end is
materialised lazily as a sorted queue of (slot, stamp) that covers every member whose stamp
is <= the queue's horizon. A queue entry is stale once its slot's stamp or tag changed (the
block was touched, moved or freed); stale entries are skipped and never become valid again,
because stamps only grow. Members beyond the horizon are sorted in when a scan needs them,
a bounded batch at a time, with vectorised numpy over the ledger's views.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

import numpy as np

from kvoffload.offload.abstract import BlockHash, SlotIds
from kvoffload.offload.block_status import FREE_TAG, SlotArrays

_VECTOR_MIN = 512  # evictions this large scan the queue in numpy chunks


class StampOrder:
    def __init__(self, ledger: SlotArrays, tag: int) -> None:
        self.ledger = ledger
        self.tag = tag
        self.size = 0
        self._queue: list[int] = []
        self._qstamp: list[int] = []
        self._pos = 0
        self._horizon = 0
        self._batch = max(4096, ledger.capacity // 64)

    def add(self, slots: Iterable[int]) -> None:
        """Make ``slots`` (not members yet) members, each more recent than the last."""
        ledger = self.ledger
        tags, stamps = ledger.tags, ledger.stamps
        clock = ledger.clock
        n = 0
        for slot in slots:
            tags[slot] = self.tag
            stamps[slot] = clock
            clock += 1
            n += 1
        ledger.clock = clock
        self.size += n

    def discard(self, slots: Iterable[int]) -> None:
        tags = self.ledger.tags
        n = 0
        for slot in slots:
            tags[slot] = FREE_TAG
            n += 1
        self.size -= n

    def oldest_first(self) -> SlotIds:
        """Every member slot, least recent first (for inspection and tests; O(n log n))."""
        members = np.flatnonzero(self.ledger.tag == self.tag)
        return members[np.argsort(self.ledger.stamp[members], kind="stable")]

    def compact(self) -> None:
        """Drop the consumed prefix once it is half the queue; never while a scan runs."""
        if self._pos > 1024 and self._pos * 2 > len(self._queue):
            del self._queue[: self._pos]
            del self._qstamp[: self._pos]
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
        self._queue.extend(members[order].tolist())
        self._qstamp.extend(stamps[order].tolist())
        self._horizon = self._qstamp[-1]
        return True

    def collect(self, n: int, protected: Container[BlockHash] | None = None) -> list[int]:
        """Up to ``n`` evictable members (ref_cnt 0, hash not protected), least recent first."""
        ledger = self.ledger
        tags, stamps, refs, hashes = ledger.tags, ledger.stamps, ledger.refs, ledger.hashes
        tag = self.tag
        queue, qstamp = self._queue, self._qstamp
        if n >= _VECTOR_MIN:
            return self._collect_vectorised(n, protected)
        out: list[int] = []
        i = self._pos
        size = len(queue)
        leading = True  # still in the run of stale entries at the queue's front
        while len(out) < n:
            if i >= size:
                if not self._extend():
                    break
                size = len(queue)
            slot = queue[i]
            if tags[slot] == tag and stamps[slot] == qstamp[i]:
                leading = False
                if refs[slot] == 0 and not (protected and hashes[slot] in protected):
                    out.append(slot)
            elif leading:
                self._pos = i + 1
            i += 1
        return out

    def _collect_vectorised(self, n: int, protected: Container[BlockHash] | None) -> list[int]:
        """``collect`` for large n: validity and ref checks on numpy chunks of the queue."""
        ledger = self.ledger
        hashes = ledger.hashes
        out: list[int] = []
        i = self._pos
        leading = True
        while len(out) < n:
            if i >= len(self._queue) and not self._extend():
                break
            j = min(len(self._queue), i + max(2 * (n - len(out)), 256))
            slots = np.array(self._queue[i:j], dtype=np.int64)
            valid = (ledger.tag[slots] == self.tag) & (ledger.stamp[slots] == np.array(self._qstamp[i:j], dtype=np.int64))
            if leading:
                if valid.all():
                    leading = False
                elif not valid.any():
                    self._pos = j
                else:
                    self._pos = i + int(np.argmax(valid))
                    leading = False
            for slot in slots[valid & (ledger.ref_cnt[slots] == 0)].tolist():
                if protected and hashes[slot] in protected:
                    continue
                out.append(slot)
                if len(out) == n:
                    break
            i = j
        return out
