"""Read-only views of a native ledger in the Python ledger's and policies' shapes, so tests,
the simulator and debugging code inspect either ledger the same way."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np

from kvoffload.offload.abstract import BlockHash, SlotIds
from kvoffload.offload.block_status import BlockStatus

if TYPE_CHECKING:
    from kvoffload_ext.ledger._ledger import Ledger


class NativeLedgerView:
    """Read access to a native ledger in the Python ledger's shape (tests, debugging):
    ``refs``/``ref_cnt`` are live; ``index`` and ``hashes`` are snapshots."""

    def __init__(self, core: Ledger, refs: array[int], capacity: int) -> None:
        self._core = core
        self.capacity = capacity
        self.refs = refs
        self.ref_cnt = np.frombuffer(refs, dtype=np.int32)

    @property
    def index(self) -> dict[BlockHash, int]:
        return dict(self._core.items())

    @property
    def hashes(self) -> list[BlockHash | None]:
        out: list[BlockHash | None] = [None] * self.capacity
        for block_hash, slot in self._core.items():
            out[slot] = block_hash
        return out


class _NativeList:
    __slots__ = ("_core", "_which")

    def __init__(self, core: Ledger, which: int) -> None:
        self._core = core
        self._which = which

    @property
    def size(self) -> int:
        return self._core.sizes[self._which - 1]

    def oldest_first(self) -> SlotIds:
        return np.asarray(self._core.order(self._which), dtype=np.int64)


class NativeLRUView:
    """The LRU policy's state in the Python policy's shape: ``order``."""

    def __init__(self, core: Ledger, refs: array[int], capacity: int) -> None:
        self._core = core
        self._refs = refs
        self.cache_capacity = capacity
        self.order = _NativeList(core, 1)

    def get(self, block_hash: BlockHash) -> BlockStatus | None:
        slot = self._core.slot_of(block_hash)
        return None if slot is None else BlockStatus.view(self._refs, slot)

    def num_ghosts(self) -> int:
        return 0


class NativeARCView(NativeLRUView):
    """ARC's state in the Python policy's shape: ``t1``/``t2``, and snapshots of ``b1``/``b2``."""

    def __init__(self, core: Ledger, refs: array[int], capacity: int) -> None:
        super().__init__(core, refs, capacity)
        self.t1 = self.order
        self.t2 = _NativeList(core, 2)

    @property
    def b1(self) -> list[BlockHash]:
        return self._core.ghosts(1)

    @property
    def b2(self) -> list[BlockHash]:
        return self._core.ghosts(2)

    @property
    def target_t1_size(self) -> float:
        return self._core.target_t1_size

    @property
    def ghost_hits(self) -> dict[BlockHash, str]:
        """Classic ARC: ghosts touched since they were evicted, awaiting their next store."""
        return {h: "b1" if which == 1 else "b2" for h, which in self._core.ghost_hits()}

    @property
    def p(self) -> float:
        """Classic ARC's name for the target size of T1."""
        return self._core.target_t1_size

    def num_ghosts(self) -> int:
        return len(self.b1) + len(self.b2)
