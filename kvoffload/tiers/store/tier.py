"""SharedStoreTier: the scheduler half of a tier in a shared key-value store.

The store is the ledger: other replicas write into it and its own eviction (a master's high
watermark) removes blocks without telling anyone. So this manager keeps no slots, only what it
has learnt recently: blocks a lookup found (asked in one batch per lookup, through
StoreLookups) and its own writes in flight. A block believed present that the store has since
evicted costs a failed load, which the connector recomputes; it never costs a wrong token,
because the worker checks every value's key and checksum.

Slot ids exist only to pair blocks with their hashes in specs (the worker addresses the store by
key), so there is no eviction here and no fence to wait on.

Its KV events say what this replica can read from the store: a block is stored once our write
lands or a lookup finds it, and removed once a lookup or read finds it gone, or once this tier
stops tracking it (the store evicts silently; a router must not count forever on a block nobody
here vouches for any more).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, Medium, OffloadingEvent, PrepareStoreOutput
from kvoffload.offload.event_queue import EventQueue
from kvoffload.offload.ledger_tier import MAX_QUEUED_EVENTS
from kvoffload.offload.mediums import KeyedLoadStoreSpec
from kvoffload.offload.tier import Tier
from kvoffload.offload.tier_health import TierHealth
from kvoffload.offload.tier_index import TierIndex
from kvoffload.offload.tier_report import TierReport
from kvoffload.tiers.store.lookups import STORE_ERROR, StoreLookups

#: How long a block that failed to load is not looked up again.
BAD_BLOCK_S = 60.0


class SharedStoreTier(Tier, TierIndex):
    """Its own index: what it has learnt of the store is all there is to read."""

    batched_lookup = True

    def __init__(self, spec_type: type[KeyedLoadStoreSpec], lookups: StoreLookups, capacity_blocks: int,
                 retry_after_s: float = 10.0, name: str = "", enable_events: bool = False,
                 block_size: int = 0) -> None:
        self.spec_type = spec_type
        self.block_size = block_size
        self.medium: Medium = spec_type.medium()
        self.lookups = lookups
        self.capacity_blocks = max(1, capacity_blocks)
        self.name = name
        self._events: EventQueue[OffloadingEvent] | None = EventQueue(
            MAX_QUEUED_EVENTS, self.describe(), "call take_events() regularly") if enable_events else None
        self.health = TierHealth(retry_after_s, self.describe)
        #: Each copy's outcome goes to the health record itself.
        self.note_io = self.health.note_io  # type: ignore[method-assign]
        self.index = self
        #: Blocks the store held when last asked (or when our write landed), oldest first.
        self._ready: OrderedDict[BlockHash, int] = OrderedDict()
        self._pending: dict[BlockHash, int] = {}
        self._hash_at: dict[int, BlockHash] = {}
        #: Blocks a read found missing or unusable, and until when lookups stop at them: the
        #: store may still answer "present" (a damaged value another replica wrote, a value
        #: our remove could not delete), and asking again would load and fail forever.
        self._bad: OrderedDict[BlockHash, float] = OrderedDict()
        self._next_slot = 0
        self.num_dropped = 0
        self.num_lookup_hits = 0

    def describe(self) -> str:
        return self.name or f"{self.medium.lower()} tier"

    @property
    def in_service(self) -> bool:
        return self.health.in_service

    # ---- what the store holds ------------------------------------------------------------
    def lookup_run(self, block_hashes: Sequence[BlockHash]) -> int | None:
        if not self.in_service:
            return 0
        block_hashes = block_hashes[: self._first_bad(block_hashes)]
        n = self.lookups.leading_run(block_hashes)
        if n is None:
            return None
        if n == STORE_ERROR:
            self.note_io(False)
            return 0
        self.note_io(True)
        for h in block_hashes[:n]:
            self._mark_ready(h)
        if n < len(block_hashes):
            self._forget(block_hashes[n])  # gone from the store (evicted, or the store restarted)
        self.num_lookup_hits += n
        return n

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int | None:
        return self.lookup_run(list(block_hashes))

    def is_ready(self, block_hash: BlockHash) -> bool:
        return block_hash in self._ready

    def is_pending(self, block_hash: BlockHash) -> bool:
        return block_hash in self._pending

    def contains(self, block_hash: BlockHash) -> bool:
        return block_hash in self._ready or block_hash in self._pending

    def slot_of(self, block_hash: BlockHash) -> int | None:
        slot = self._ready.get(block_hash)
        return slot if slot is not None else self._pending.get(block_hash)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        for h in block_hashes:
            if h in self._ready:
                self._ready.move_to_end(h)

    # ---- loads and stores ----------------------------------------------------------------
    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        hashes = list(block_hashes)
        return self.spec_type([self._slot(h) for h in hashes], hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        self.touch(block_hashes)

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        new = [h for h in dict.fromkeys(block_hashes) if not self.contains(h)]
        slots = []
        for h in new:
            slot = self._new_slot(h)
            self._pending[h] = slot
            slots.append(slot)
        return PrepareStoreOutput(new, self.spec_type(slots, new), [], [])

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        for h in block_hashes:
            slot = self._pending.pop(h, None)
            if slot is None:
                continue
            if success:
                if h not in self._ready:
                    self._emit([h], removed=False)
                self._ready[h] = slot
                self._bad.pop(h, None)  # our own fresh copy
                self._trim()
            else:
                self._release(h, slot)

    def slot_spec(self, slots: Sequence[int], block_hashes: list[BlockHash]) -> LoadStoreSpec:
        return self.spec_type(slots, list(block_hashes))

    def drop_slots(self, slots: list[int]) -> int:
        """Blocks a read found missing, torn or of another key: forget them, so lookups miss."""
        n = 0
        until = time.monotonic() + BAD_BLOCK_S
        for slot in slots:
            h = self._hash_at.get(slot)
            if h is not None and h in self._ready:
                self._forget(h)
                self._bad[h] = until
                self._bad.move_to_end(h)
                n += 1
        while len(self._bad) > self.capacity_blocks:
            self._bad.popitem(last=False)
        self.num_dropped += n
        return n

    def _first_bad(self, block_hashes: Sequence[BlockHash]) -> int:
        if self._bad:
            now = time.monotonic()
            for i, h in enumerate(block_hashes):
                until = self._bad.get(h)
                if until is not None:
                    if until > now:
                        return i
                    del self._bad[h]
        return len(block_hashes)

    # ---- bookkeeping ---------------------------------------------------------------------
    def _new_slot(self, block_hash: BlockHash) -> int:
        slot = self._next_slot
        self._next_slot = (self._next_slot + 1) % (1 << 62)
        self._hash_at[slot] = block_hash
        return slot

    def _slot(self, block_hash: BlockHash) -> int:
        slot = self.slot_of(block_hash)
        return slot if slot is not None else self._new_slot(block_hash)

    def _mark_ready(self, block_hash: BlockHash) -> None:
        if block_hash in self._ready:
            self._ready.move_to_end(block_hash)
            return
        self._ready[block_hash] = self._slot(block_hash)
        self._emit([block_hash], removed=False)
        self._trim()

    def _release(self, block_hash: BlockHash, slot: int | None) -> None:
        """Free a slot id no longer held by the ready set, unless a write in flight still uses it."""
        if slot is not None and block_hash not in self._pending:
            self._hash_at.pop(slot, None)

    def _forget(self, block_hash: BlockHash) -> None:
        slot = self._ready.pop(block_hash, None)
        if slot is not None:
            self._emit([block_hash], removed=True)
        self._release(block_hash, slot)

    def _trim(self) -> None:
        while len(self._ready) > self.capacity_blocks:
            h, slot = self._ready.popitem(last=False)
            self._emit([h], removed=True)
            self._release(h, slot)

    def _emit(self, hashes: list[BlockHash], removed: bool) -> None:
        if self._events is not None:
            self._events.put(OffloadingEvent(hashes, self.block_size, self.medium, removed))

    def take_events(self) -> list[OffloadingEvent]:
        return self._events.take() if self._events is not None else []

    # ---- reports -------------------------------------------------------------------------
    def report(self) -> TierReport:
        lookups = self.lookups
        return TierReport(self.medium, len(self._ready) + len(self._pending), self.capacity_blocks,
                          writing_blocks=len(self._pending), in_service=self.in_service,
                          corrupt_blocks=self.num_dropped, io_errors=self.health.num_io_errors,
                          outages=self.health.num_outages, lookup_queries=lookups.num_queries,
                          lookup_hit_blocks=self.num_lookup_hits, lookups_deferred=lookups.num_deferred,
                          lookups_given_up=lookups.num_given_up)

    def close(self) -> None:
        self.lookups.close()
