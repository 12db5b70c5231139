"""SecondaryTierManager: the scheduler-side contract of a tier behind host memory (disk, a
shared store), so a chain of tiers composes without knowing what each one is.

A secondary tier never touches device memory: blocks reach it from the tier above (a victim
demoted, or a copy written through) and leave it for the device through a staging copy, then
are promoted into the host tier by the connector re-storing them. Scheduler-side and
tensor-free, like every ledger.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import ClassVar

from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, Medium, OffloadingEvent, PrepareStoreOutput
from kvoffload.offload.cpu_manager import CPUOffloadingManager

logger = logging.getLogger(__name__)


class SecondaryTierManager(ABC):
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
    def is_pending(self, block_hash: BlockHash) -> bool:
        """Present but its write has not completed."""

    @abstractmethod
    def contains(self, block_hash: BlockHash) -> bool:
        """Present, ready or not."""

    @abstractmethod
    def slot_of(self, block_hash: BlockHash) -> int | None:
        """The slot a present block occupies."""

    @abstractmethod
    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        """Pin ready blocks; the spec names their slots and hashes (reads check each key)."""

    @abstractmethod
    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        """Unpin blocks a load read."""

    @abstractmethod
    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        """Slots for absent hashes (evicting unpinned ready blocks), inserted not ready; None and
        no change when eviction cannot free enough. Victims' slots come in ``evicted_block_ids``."""

    @abstractmethod
    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        """A write landed (blocks become ready) or failed (their slots are freed)."""

    @abstractmethod
    def slot_spec(self, slots: list[int], block_hashes: list[BlockHash]) -> LoadStoreSpec:
        """The spec of these slots of this tier, naming the hashes their records are keyed by."""

    @abstractmethod
    def drop_slots(self, slots: list[int]) -> int:
        """Forget the blocks at these slots (a read found them corrupt or unreadable)."""

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Recency, as in the host tier (default: nothing)."""

    def note_io(self, ok: bool, write: bool = False) -> None:
        """One copy's outcome against this tier (default: nothing)."""

    def take_events(self) -> Iterable[OffloadingEvent]:
        return ()

    def stats(self) -> dict[str, int]:
        """Counters, reported prefixed by the medium (``disk_io_errors``...)."""
        return {}

    def usage(self) -> dict[str, tuple[int, int]]:
        """(blocks held, capacity in blocks) by lower-case medium; {} when unknown."""
        return {}

    def close(self) -> None:
        """Release files, connections, threads."""


class TierHealth:
    """The I/O health every fallible tier needs: MAX_IO_ERRORS failed copies in a row (reads and
    writes counted apart: a tier that takes writes but fails every read is of no use) take it
    out of service for ``retry_after_s``; then it is tried again."""

    MAX_IO_ERRORS = 3

    def _init_health(self, retry_after_s: float) -> None:
        self.num_io_errors = 0
        self.num_outages = 0
        self.retry_after_s = retry_after_s
        self._errors_in_a_row = [0, 0]  # reads, writes
        self._out_until = 0.0

    def describe(self) -> str:
        """How log lines name this tier."""
        return f"{self.medium.lower()} tier"  # type: ignore[attr-defined]

    @property
    def in_service(self) -> bool:
        if self._out_until and time.monotonic() >= self._out_until:
            self._out_until = 0.0
            self._errors_in_a_row = [0, 0]
            logger.warning("%s: back in service after an I/O outage", self.describe())
        return not self._out_until

    def note_io(self, ok: bool, write: bool = False) -> None:
        if ok:
            self._errors_in_a_row[write] = 0
            return
        self.num_io_errors += 1
        self._errors_in_a_row[write] += 1
        if self._errors_in_a_row[write] >= self.MAX_IO_ERRORS and not self._out_until:
            self._out_until = time.monotonic() + self.retry_after_s
            self.num_outages += 1
            logger.warning("%s: %d %s errors in a row; out of service for %g s, serving from the "
                           "other tiers and recompute", self.describe(), self._errors_in_a_row[write],
                           "write" if write else "read", self.retry_after_s)


class LedgerTierManager(TierHealth, CPUOffloadingManager, SecondaryTierManager):
    """A secondary tier over a slot ledger (this process owns every slot), with TierHealth."""

    def __init__(self, num_blocks: int, cache_policy: object = "lru", enable_events: bool = False,
                 block_size: int = 0, retry_after_s: float = 60.0) -> None:
        super().__init__(num_blocks, cache_policy, enable_events, block_size=block_size)  # type: ignore[arg-type]
        self.num_corrupt = 0
        self._init_health(retry_after_s)

    def slot_spec(self, slots: list[int], block_hashes: list[BlockHash]) -> LoadStoreSpec:
        return self.spec_type(slots, list(block_hashes))  # type: ignore[call-arg]

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        hashes = list(block_hashes)
        spec = super().prepare_load(hashes)
        return self.spec_type(spec.block_ids, hashes)  # type: ignore[call-arg]

    def drop_slots(self, slots: list[int]) -> int:
        hashes = [h for h in (self.hash_at(s) for s in slots) if h is not None]
        n = len(self.drop(hashes))
        self.num_corrupt += n
        return n

    def stats(self) -> dict[str, int]:
        return {"corrupt_blocks": self.num_corrupt, "io_errors": self.num_io_errors, "outages": self.num_outages}
