"""SlotLedger: the bookkeeping of one tier's slots (which hash is in which slot, ready or being
written, pinned by how many loads, and which slots the policy gives up first).

A tier holds one ledger and adds what a ledger does not know: its medium, the spec type its
slots travel in, events, I/O health. Two implementations keep the same contract, slot order and
eviction order: the Python one (any CachePolicy) and the native one (LRU and ARC in C); built by
``make_ledger``. Tensor-free, like everything scheduler-side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvoffload.offload.abstract import BlockHash


class BlockNotReadyError(KeyError):
    """prepare_load was asked for a block that is absent or still being written."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class StoreSlots:
    """What ``allocate`` did: the hashes that were absent and the slots they now occupy (not
    ready), and the victims evicted to make room, with the slots they held."""

    new: list[BlockHash]
    slots: Sequence[int]
    evicted: list[BlockHash]
    evicted_slots: list[int]


class LedgerArrays(Protocol):
    """The ledger's state in the Python ledger's shape, for tests and debugging: hash → slot,
    slot → hash, and the ref counts (-1 being written, 0 ready, n > 0 pinned by n loads)."""

    @property
    def index(self) -> dict[BlockHash, int]: ...

    @property
    def hashes(self) -> list[BlockHash | None]: ...

    @property
    def ref_cnt(self) -> npt.NDArray[np.int32]: ...


class SlotLedger(ABC):
    """Slot ids: never-used ids first in increasing order, then freed ids last-freed-first."""

    capacity: int

    @abstractmethod
    def lookup(self, block_hashes: list[BlockHash]) -> int:
        """Length of the leading run of present and ready blocks."""

    @abstractmethod
    def pin(self, block_hashes: list[BlockHash]) -> Sequence[int]:
        """Slots of ready blocks, each pinned once more; raises BlockNotReadyError, pinning
        nothing, when one is absent or being written."""

    @abstractmethod
    def unpin(self, block_hashes: list[BlockHash]) -> None:
        """Release one pin of each block; ValueError, changing nothing, for a block not pinned."""

    @abstractmethod
    def allocate(self, block_hashes: Iterable[BlockHash]) -> StoreSlots | None:
        """Slots for the absent hashes, inserted being written, evicting (never a pinned,
        written or offered block) when the free slots are too few; None and no change at all
        when eviction cannot free enough."""

    @abstractmethod
    def complete(self, block_hashes: Iterable[BlockHash], success: bool) -> list[BlockHash]:
        """Blocks being written become ready (or are freed on failure); returns those changed."""

    @abstractmethod
    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """A reuse: ``block_hashes[0]`` ends up the most recent."""

    @abstractmethod
    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        """Recency without reuse (ARC keeps the blocks in T1)."""

    @abstractmethod
    def store_miss(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Show the policy the absent hashes about to be stored (ghost hits); returns them."""

    @abstractmethod
    def restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Re-admit ready blocks at known slots (a persistent tier reopening); only when empty."""

    @abstractmethod
    def drop(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Forget ready, unpinned blocks; returns those forgotten."""

    @abstractmethod
    def hash_at(self, slot: int) -> BlockHash | None: ...

    @abstractmethod
    def slot_of(self, block_hash: BlockHash) -> int | None: ...

    @abstractmethod
    def contains(self, block_hash: BlockHash) -> bool:
        """Present, ready or not."""

    @abstractmethod
    def is_ready(self, block_hash: BlockHash) -> bool: ...

    @abstractmethod
    def is_pending(self, block_hash: BlockHash) -> bool:
        """Present but still being written."""

    @property
    @abstractmethod
    def num_used(self) -> int: ...

    @property
    @abstractmethod
    def num_free(self) -> int: ...

    @abstractmethod
    def busy(self) -> tuple[int, int]:
        """Blocks pinned by loads, and blocks being written."""

    @property
    @abstractmethod
    def arrays(self) -> LedgerArrays:
        """The state in the Python ledger's shape (tests, debugging)."""

    @property
    @abstractmethod
    def policy(self) -> object:
        """The eviction policy's state (the CachePolicy, or a view of the native one)."""
