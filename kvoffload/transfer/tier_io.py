"""TierIO: the worker-side block I/O of one secondary tier, on this rank.

Synchronous by design: the tier's handler runs it on its own threads, so a tier plugin only
says how to write and read keyed records, and the handler does the rest (host and device
copies, staging, fences, completion accounting) the same way for every tier.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from kvoffload.offload.abstract import BlockHash


class TierIO(ABC):
    #: How log lines and errors name the tier (e.g. "disk tier /var/cache/kvoffload").
    name: str = "tier"

    @abstractmethod
    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        """Store each block (one offloaded block's bytes on this rank) in its slot, keyed by its
        hash. Raise BlockTransferError(io=True) when the medium fails."""

    @abstractmethod
    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        """Fill ``out[i]`` with the block in ``slots[i]``, checking that it is intact and keyed
        by ``keys[i]``. Raise BlockTransferError naming the bad slots (io=True for a failed
        read, False for a record torn, flipped or of another block)."""

    def register_memory(self, ptr: int, nbytes: int) -> None:
        """Host memory the handler will pass to ``write`` often (the host tier's buffer): a tier
        that can copy from registered memory directly registers it once (default: nothing)."""

    def close(self) -> None:
        """Release files and connections."""
