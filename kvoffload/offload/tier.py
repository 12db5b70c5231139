"""Tier: the contract of one tier in a chain (host memory, disk, a shared store), so a chain
composes without knowing what each tier is.

Every tier is a small OffloadingManager plus what the chain asks of each tier beyond reading (a
spec naming slots and hashes, dropping what a read found corrupt, the outcome of each copy, a
typed report); its reads (which blocks, ready or being written, in which slot) are its
``index``'s, which the chain asks directly. A tier behind host memory never touches
device memory: blocks reach it from the tier above (a victim demoted, or a copy written through)
and leave it for the device through a staging copy. Scheduler-side and tensor-free.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, Medium, OffloadingManager
from kvoffload.offload.tier_index import TierIndex
from kvoffload.offload.tier_report import TierReport


class Tier(OffloadingManager):
    #: The medium of this tier's slots; one tier per medium in a chain (copies are routed by it).
    medium: Medium
    #: True for a tier whose ledger is elsewhere (a shared store): a lookup asks it once, with
    #: ``lookup_run``, for the run of blocks the tiers above it miss, never block by block.
    batched_lookup: ClassVar[bool] = False
    #: What answers this tier's reads (a ledger tier's slot table; a store tier answers for
    #: itself): the chain reads through it, never through the tier.
    index: TierIndex

    # vLLM's read verbs on a lone tier (SPEC §6: ``CPUOffloadingManager(...).lookup``) are its
    # index's own callables, handed out, not methods that pass each call on.
    @property
    def lookup(self) -> Callable[[Iterable[BlockHash]], int | None]:
        return self.index.lookup

    @property
    def touch(self) -> Callable[[Iterable[BlockHash]], None]:
        return self.index.touch

    @property
    def in_service(self) -> bool:
        """False while the tier is out after repeated I/O errors: lookups and demotions skip it."""
        return True

    def lookup_run(self, block_hashes: Sequence[BlockHash]) -> int | None:
        """How many leading blocks of ``block_hashes`` the tier holds ready, asked in one go;
        None when it cannot answer yet (the caller asks again next step, never waits)."""
        return self.index.lookup(block_hashes)

    @abstractmethod
    def slot_spec(self, slots: Sequence[int], block_hashes: list[BlockHash]) -> LoadStoreSpec:
        """The spec of these slots of this tier, naming the hashes their records are keyed by."""

    @abstractmethod
    def drop_slots(self, slots: list[int]) -> int:
        """Forget the blocks at these slots (a read found them corrupt or unreadable)."""

    def note_io(self, ok: bool, write: bool = False) -> None:
        """One copy's outcome against this tier (default: nothing)."""

    @abstractmethod
    def report(self) -> TierReport:
        """The tier's state and counters."""
