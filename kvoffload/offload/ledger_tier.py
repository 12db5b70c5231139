"""LedgerTier: a tier whose slots this process owns, kept by a SlotLedger (host memory, a local
disk file, the test tiers). The one tier-manager class: the medium, spec type, events and I/O
health are the tier's; every decision about slots is the ledger's."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import (
    BlockHash,
    LoadStoreSpec,
    OffloadingEvent,
    PrepareStoreOutput,
    as_list,
)
from kvoffload.offload.slot_ledger import LedgerArrays, SlotLedger
from kvoffload.offload.tier import Tier
from kvoffload.offload.tier_health import TierHealth
from kvoffload.offload.tier_report import TierReport

logger = logging.getLogger(__name__)

#: Undrained events kept per tier before the oldest are dropped.
MAX_QUEUED_EVENTS = 10_000


class LedgerTier(Tier):
    def __init__(self, ledger: SlotLedger, spec_type: type[LoadStoreSpec], block_size: int = 0,
                 enable_events: bool = False, retry_after_s: float | None = None) -> None:
        """``retry_after_s``: a tier whose copies can fail (a file) keeps I/O health and goes out
        of service that long after errors in a row; None = it cannot fail (host memory)."""
        self.slot_ledger = ledger
        self.spec_type = spec_type
        self.medium = spec_type.medium()
        self.num_blocks = ledger.capacity
        self.block_size = block_size
        self.health = TierHealth(retry_after_s, self.describe) if retry_after_s is not None else None
        self.num_corrupt = 0
        self._events: deque[OffloadingEvent] | None = deque() if enable_events else None
        self.num_events_dropped = 0

    def describe(self) -> str:
        """How log lines name this tier."""
        return f"{self.medium.lower()} tier"

    # ---- introspection -------------------------------------------------------------------
    @property
    def ledger(self) -> LedgerArrays:
        """The ledger's state in the Python ledger's shape (tests, debugging)."""
        return self.slot_ledger.arrays

    @property
    def policy(self) -> object:
        return self.slot_ledger.policy

    @property
    def num_free_blocks(self) -> int:
        return self.slot_ledger.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.slot_ledger.num_used

    def _emit(self, hashes: list[BlockHash], removed: bool) -> None:
        events = self._events
        if events is not None and hashes:
            if len(events) >= MAX_QUEUED_EVENTS:  # nobody drains them: keep memory bounded
                events.popleft()
                if not self.num_events_dropped:
                    logger.warning("%s tier: %d KV events queued and not taken; dropping the oldest "
                                   "(call take_events() regularly)", self.medium, MAX_QUEUED_EVENTS)
                self.num_events_dropped += 1
            events.append(OffloadingEvent(hashes, self.block_size, self.medium, removed))

    # ---- the manager contract ------------------------------------------------------------
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        return self.slot_ledger.lookup(as_list(block_hashes))

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        hashes = as_list(block_hashes)
        return self.slot_spec(self.slot_ledger.pin(hashes), hashes)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self.slot_ledger.touch(block_hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        self.slot_ledger.unpin(as_list(block_hashes))

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        out = self.slot_ledger.allocate(block_hashes)
        if out is None:
            return None
        if out.evicted:
            self._emit(out.evicted, removed=True)
        return PrepareStoreOutput(out.new, self.slot_spec(out.slots, out.new), out.evicted, out.evicted_slots)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        done = self.slot_ledger.complete(block_hashes, success)
        if success:
            self._emit(done, removed=False)

    def take_events(self) -> list[OffloadingEvent]:
        if not self._events:
            return []
        events = list(self._events)
        self._events.clear()
        return events

    # ---- what the chain asks of a tier ---------------------------------------------------
    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        return self.slot_ledger.store_miss(block_hashes)

    def refresh(self, block_hashes: Sequence[BlockHash]) -> None:
        """Recency without reuse (see CachePolicy.refresh)."""
        self.slot_ledger.refresh(block_hashes)

    def is_ready(self, block_hash: BlockHash) -> bool:
        return self.slot_ledger.is_ready(block_hash)

    def is_pending(self, block_hash: BlockHash) -> bool:
        return self.slot_ledger.is_pending(block_hash)

    def contains(self, block_hash: BlockHash) -> bool:
        return self.slot_ledger.contains(block_hash)

    def slot_of(self, block_hash: BlockHash) -> int | None:
        return self.slot_ledger.slot_of(block_hash)

    def hash_at(self, slot: int) -> BlockHash | None:
        return self.slot_ledger.hash_at(slot)

    def slot_spec(self, slots: Sequence[int], block_hashes: list[BlockHash]) -> LoadStoreSpec:
        return self.spec_type.for_blocks(slots, block_hashes)

    def restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Re-admit ready blocks at known slots (a persistent tier reopening); only when empty."""
        self.slot_ledger.restore(entries)

    def drop(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Forget ready, unpinned blocks (found corrupt); returns the hashes dropped."""
        dropped = self.slot_ledger.drop(block_hashes)
        self._emit(dropped, removed=True)
        return dropped

    def drop_slots(self, slots: list[int]) -> int:
        hashes = [h for h in map(self.slot_ledger.hash_at, slots) if h is not None]
        n = len(self.drop(hashes))
        self.num_corrupt += n
        return n

    @property
    def in_service(self) -> bool:
        return self.health is None or self.health.in_service

    def note_io(self, ok: bool, write: bool = False) -> None:
        if self.health is not None:
            self.health.note_io(ok, write)

    def report(self) -> TierReport:
        pinned, writing = self.slot_ledger.busy()
        health = self.health
        return TierReport(self.medium, self.slot_ledger.num_used, self.num_blocks, pinned, writing,
                          in_service=self.in_service, corrupt_blocks=self.num_corrupt,
                          io_errors=health.num_io_errors if health else 0,
                          outages=health.num_outages if health else 0)
