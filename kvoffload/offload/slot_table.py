"""SlotTable: the index of a tier whose slots this process owns (a TierIndex that also writes): which hash is in which slot,
ready or being written, pinned by how many loads, and the eviction order over them.

One interface, two implementations chosen when the tier is built (``make_slot_table``):
``PythonSlotTable`` for any CachePolicy (the reference) and ``NativeSlotTable`` (C) for the
policies the native ledger implements. Slot ids: never-used ids first in increasing order, then
freed ids last-freed-first. Tensor-free, like everything scheduler-side.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvoffload.offload.abstract import BlockHash, SlotIds
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.tier_index import TierIndex

#: What ``allocate`` shows the policy as store misses, and notes there (see ``allocate``).
Shown = set[BlockHash] | list[BlockHash]


@dataclass(slots=True)
class StoreSlots:
    """What ``allocate`` did: the hashes that were absent and the slots they now occupy (not
    ready), and the victims evicted to make room, with the slots they held. Not frozen: one is
    built per store, and a frozen dataclass's ``__init__`` costs three times as much."""

    new: list[BlockHash]
    slots: Sequence[int] | SlotIds
    evicted: list[BlockHash]
    #: Empty when the caller said it will not demote the victims (``victim_slots=False``).
    evicted_slots: list[int]


class LedgerSnapshot(Protocol):
    """The ledger's state in the Python ledger's shape, for tests and debugging: hash → slot,
    slot → hash, and the ref counts (-1 being written, 0 ready, n > 0 pinned by n loads)."""

    @property
    def index(self) -> dict[BlockHash, int]: ...

    @property
    def hashes(self) -> list[BlockHash | None]: ...

    @property
    def ref_cnt(self) -> npt.NDArray[np.int32]: ...


class SlotTable(TierIndex):
    """The reads a chain asks of a ledger tier, and the slot primitives the tier's writes are
    made of."""

    def __init__(self, capacity: int, medium: str) -> None:
        self.capacity = capacity
        self.medium = medium  # names the tier in error messages

    @property
    @abstractmethod
    def num_free(self) -> int: ...

    @property
    @abstractmethod
    def num_used(self) -> int: ...

    @property
    @abstractmethod
    def policy(self) -> object:
        """The eviction policy's state (the CachePolicy, or a view of the native one)."""

    @abstractmethod
    def debug_snapshot(self) -> LedgerSnapshot:
        """The ledger's state (tests, debugging; the native ledger's is a copy)."""

    @abstractmethod
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        """How many leading hashes are present and ready."""

    @abstractmethod
    def pin(self, block_hashes: list[BlockHash]) -> Sequence[int] | SlotIds:
        """Slots of ready blocks, each pinned once more; raises BlockNotReadyError, pinning
        nothing, when one is absent or being written."""

    @abstractmethod
    def unpin(self, block_hashes: list[BlockHash]) -> None:
        """Release one pin of each block; ValueError, changing nothing, for a block not pinned."""

    @abstractmethod
    def touch(self, block_hashes: Iterable[BlockHash]) -> None: ...

    @abstractmethod
    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        """Recency without reuse (see CachePolicy.refresh)."""

    @abstractmethod
    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None: ...

    @abstractmethod
    def store_miss(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Show the policy the absent hashes about to be stored (ghost hits); returns them."""

    @abstractmethod
    def allocate(self, block_hashes: Iterable[BlockHash], shown: Shown | None = None,
                 victim_slots: bool = True) -> StoreSlots | None:
        """Slots for the absent hashes, inserted being written, evicting (never a pinned,
        written or offered block) when the free slots are too few; None and no change at all
        when eviction cannot free enough. ``shown``: first, the absent hashes are shown to the
        policy (``store_miss``), in the same call (vLLM's route shows each once per request):
        a set skips those in it and adds those shown; an empty list (the request's first
        store: nothing to skip, and a list is cheaper to fill) gets those shown appended.
        ``victim_slots=False``: the caller will not demote the victims, so their slots are not
        listed (a Python int each)."""

    @abstractmethod
    def complete(self, block_hashes: Iterable[BlockHash], success: bool) -> list[BlockHash]:
        """Blocks being written become ready (or are freed on failure); returns those changed."""

    @abstractmethod
    def restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Re-admit ready blocks at known slots (a persistent tier reopening); only when empty."""

    @abstractmethod
    def forget_ready(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Forget ready, unpinned blocks, without an event; returns those forgotten."""

    @abstractmethod
    def hash_at(self, slot: int) -> BlockHash | None: ...

    @abstractmethod
    def busy(self) -> tuple[int, int]:
        """Blocks pinned by loads, and blocks being written."""
