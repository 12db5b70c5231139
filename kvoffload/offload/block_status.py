"""Per-block state kept slot-indexed, so tracking a block costs bytes, not a Python object.

``SlotArrays`` holds one entry per slot of a tier: the ref count, the hash stored there, a
recency stamp and a list tag for the policy. Each array is an ``array.array`` (fast scalar
access for per-request batches) with a zero-copy numpy view (vectorised scans). ``BlockStatus`` is the
vLLM-shaped record (``ref_cnt``, ``block_id``) exposed to policies and tests: a live view of
one ledger slot, or a free-standing record until a policy adopts it.

ref_cnt: -1 = being written (not ready); 0 = ready and evictable; n > 0 = n in-flight reads.
"""

from __future__ import annotations

from array import array

import numpy as np

from kvoffload.errors import require_positive
from kvoffload.offload.abstract import BlockHash

#: Ledger tag of a slot that belongs to no policy list.
FREE_TAG = 0


class BlockStatus:
    __slots__ = ("_idx", "_refs", "block_id")

    def __init__(self, block_id: int, ref_cnt: int = -1) -> None:
        self._refs = array("i", [ref_cnt])
        self._idx = 0
        self.block_id = int(block_id)

    @classmethod
    def view(cls, refs: array[int], block_id: int) -> BlockStatus:
        status = cls.__new__(cls)
        status._refs = refs
        status._idx = block_id
        status.block_id = block_id
        return status

    def bind(self, refs: array[int]) -> None:
        """Move this record's value into ``refs[block_id]`` and become a view of it."""
        refs[self.block_id] = self._refs[self._idx]
        self._refs = refs
        self._idx = self.block_id

    @property
    def ref_cnt(self) -> int:
        return self._refs[self._idx]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        self._refs[self._idx] = value

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"BlockStatus(block_id={self.block_id}, ref_cnt={self.ref_cnt})"

_RESTAMP_VECTOR_MIN = 48  # restamps longer than this assign stamps with numpy


class SlotArrays:
    """Slot-indexed arrays plus the one hash → slot dict; shared by a tier and its policy.

    ``refs``/``stamps``/``tags`` are the arrays; ``ref_cnt``/``stamp``/``tag`` their numpy views.
    """

    def __init__(self, capacity: int) -> None:
        require_positive("ledger capacity", capacity)
        self.capacity = capacity
        self.index: dict[BlockHash, int] = {}
        self.hashes: list[BlockHash | None] = [None] * capacity
        self.refs = array("i", bytes(4 * capacity))
        self.stamps = array("q", bytes(8 * capacity))
        self.tags = array("b", bytes(capacity))
        self.ref_cnt = np.frombuffer(self.refs, dtype=np.int32)
        self.stamp = np.frombuffer(self.stamps, dtype=np.int64)
        self.tag = np.frombuffer(self.tags, dtype=np.int8)
        self.clock = 1

    def restamp(self, block_hashes: list[BlockHash]) -> None:
        """Newest stamps for the present hashes, ``block_hashes[0]`` the newest (absent ones skipped)."""
        index_get = self.index.get
        if len(block_hashes) > _RESTAMP_VECTOR_MIN:
            slots = [s for s in map(index_get, reversed(block_hashes)) if s is not None]
            if slots:
                # Later writes win, so the earliest occurrence of a hash gets the newest stamp.
                self.stamp[np.fromiter(slots, np.int64, len(slots))] = self.clock + np.arange(len(slots))
                self.clock += len(slots)
            return
        stamps = self.stamps
        clock = self.clock
        for block_hash in reversed(block_hashes):
            slot = index_get(block_hash)
            if slot is not None:
                stamps[slot] = clock
                clock += 1
        self.clock = clock

    def status(self, block_id: int) -> BlockStatus:
        return BlockStatus.view(self.refs, block_id)
