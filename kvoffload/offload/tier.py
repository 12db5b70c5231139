"""Tier: the contract of one tier in a chain (host memory, disk, a shared store), so a chain
composes without knowing what each tier is.

Every tier is a small OffloadingManager plus what the chain asks of each tier: whether a block
is ready or being written, its slot, a spec naming slots and hashes, dropping what a read found
corrupt, the outcome of each copy, and a typed report. A tier behind host memory never touches
device memory: blocks reach it from the tier above (a victim demoted, or a copy written through)
and leave it for the device through a staging copy. Scheduler-side and tensor-free.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, Medium, OffloadingManager
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.tier_report import TierReport


class Tier(OffloadingManager):
    #: The medium of this tier's slots; one tier per medium in a chain (copies are routed by it).
    medium: Medium
    #: True for a tier whose ledger is elsewhere (a shared store): a lookup asks it once, with
    #: ``lookup_run``, for the run of blocks the tiers above it miss, never block by block.
    batched_lookup: ClassVar[bool] = False

    @property
    def in_service(self) -> bool:
        """False while the tier is out after repeated I/O errors: lookups and demotions skip it."""
        return True

    @abstractmethod
    def is_ready(self, block_hash: BlockHash) -> bool:
        """Stored and its write completed."""

    @abstractmethod
    def is_pending(self, block_hash: BlockHash) -> bool:
        """Present but its write has not completed."""

    @abstractmethod
    def contains(self, block_hash: BlockHash) -> bool:
        """Present, ready or not."""

    @abstractmethod
    def slot_of(self, block_hash: BlockHash) -> int | None:
        """The slot a present block occupies."""

    def lookup_run(self, block_hashes: Sequence[BlockHash]) -> int | None:
        """How many leading blocks of ``block_hashes`` the tier holds ready, asked in one go;
        None when it cannot answer yet (the caller asks again next step, never waits)."""
        n = 0
        for h in block_hashes:
            if not self.is_ready(h):
                break
            n += 1
        return n

    @abstractmethod
    def slot_spec(self, slots: Sequence[int], block_hashes: list[BlockHash]) -> LoadStoreSpec:
        """The spec of these slots of this tier, naming the hashes their records are keyed by."""

    @abstractmethod
    def drop_slots(self, slots: list[int]) -> int:
        """Forget the blocks at these slots (a read found them corrupt or unreadable)."""

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """Show the policy the offered hashes that are absent, before a store inserts them (ARC
        adapts to ghost hits here); returns those shown. Default: nothing."""
        return []

    def refresh(self, block_hashes: Sequence[BlockHash]) -> None:
        """Recency without reuse, e.g. a request's newly stored blocks (default: nothing)."""

    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None:
        """A request's hint for its blocks (see CachePolicy.hint; default: nothing)."""

    def note_io(self, ok: bool, write: bool = False) -> None:
        """One copy's outcome against this tier (default: nothing)."""

    @abstractmethod
    def report(self) -> TierReport:
        """The tier's state and counters."""
