"""CPUOffloadingManager: the block ledger of one tier (slots, ref counts, events).

Slot ids: never-used ids first in increasing order, then freed ids last-freed-first.
Eviction decisions belong to the CachePolicy; this class owns everything else. It drives
every policy through the slot-level calls (SlotPolicy): built-in policies share its
BlockLedger and implement them natively, any other CachePolicy through PlainPolicySlots.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvoffload.offload.abstract import (
    BlockHash,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    as_list,
)
from kvoffload.offload.block_status import BlockLedger
from kvoffload.offload.mediums import CPULoadStoreSpec
from kvoffload.offload.policy import CachePolicy, LedgerCachePolicy, PlainPolicySlots, SlotPolicy
from kvoffload.offload.policy_registry import create_policy

logger = logging.getLogger(__name__)

#: Undrained events kept per tier before the oldest are dropped.
MAX_QUEUED_EVENTS = 10_000

#: Batches longer than this go through numpy; short ones are faster as plain loops.
_VECTOR_MIN = 48


def _add(refs: np.ndarray, arr: np.ndarray, slots: list[int], delta: int) -> None:
    if len(set(slots)) == len(slots):
        refs[arr] += delta  # unique slots (the usual case): plain fancy indexing
    else:
        np.add.at(refs, arr, delta)


class BlockNotReadyError(KeyError):
    """prepare_load was asked for a block that is absent or still being written."""

    def __str__(self) -> str:
        return str(self.args[0])


class CPUOffloadingManager(OffloadingManager):
    spec_type: type[LoadStoreSpec] = CPULoadStoreSpec

    def __new__(cls, *args: Any, **kwargs: Any) -> CPUOffloadingManager:
        """"lru", "arc" and "arc_classic" by name get the native ledger where it is built (``native``: None =
        when available, False = never, True = or raise); subclasses, and the copy protocol's bare
        ``cls.__new__(cls)``, always get the class asked for."""
        if cls is CPUOffloadingManager and (args or kwargs):
            # Imported here: the native manager derives from this class.
            from kvoffload.offload.native_manager import NativeCPUOffloadingManager, wants_native

            policy = args[1] if len(args) > 1 else kwargs.get("cache_policy", "lru")
            native = args[4] if len(args) > 4 else kwargs.get("native")
            if wants_native(policy, native):
                return super().__new__(NativeCPUOffloadingManager)
        return super().__new__(cls)

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str | CachePolicy = "lru",
        enable_events: bool = False,
        block_size: int = 0,
        native: bool | None = None,
    ) -> None:
        self._init_tier(num_blocks, block_size, enable_events)
        self.ledger = BlockLedger(num_blocks)
        self.policy = create_policy(cache_policy, num_blocks)
        self._slots: SlotPolicy
        if isinstance(self.policy, LedgerCachePolicy):
            self.policy.bind_ledger(self.ledger)
            self._slots = self.policy
        else:
            self._slots = PlainPolicySlots(self.policy, self.ledger)
        self._num_allocated = 0
        self._free_list: list[int] = []

    def _init_tier(self, num_blocks: int, block_size: int, enable_events: bool) -> None:
        """What every CPU-tier ledger has, whichever implementation keeps its blocks."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: a tier needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.medium = self.spec_type.medium()
        self._events: deque[OffloadingEvent] | None = deque() if enable_events else None
        self.num_events_dropped = 0

    # ---- helpers -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free_list) + self.num_blocks - self._num_allocated

    @property
    def num_used_blocks(self) -> int:
        return len(self.ledger.index)

    def _allocate(self, n: int) -> list[int]:
        fresh = min(n, self.num_blocks - self._num_allocated)
        slots = list(range(self._num_allocated, self._num_allocated + fresh))
        self._num_allocated += fresh
        reused = n - fresh
        if reused:
            free = self._free_list
            slots.extend(free[: -reused - 1 : -1])  # last freed first
            del free[-reused:]
        return slots

    def _forget(self, block_hash: BlockHash, slot: int) -> None:
        del self.ledger.index[block_hash]
        self.ledger.hashes[slot] = None
        self.ledger.refs[slot] = 0  # a free slot counts as neither read nor written
        self._free_list.append(slot)

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

    def _slots_of(self, block_hashes: Iterable[BlockHash]) -> list[int]:
        index = self.ledger.index
        try:
            return list(map(index.__getitem__, block_hashes))
        except KeyError as exc:
            raise BlockNotReadyError(f"block {exc.args[0]!r} is not stored in the {self.medium} tier") from None

    # ---- contract ------------------------------------------------------------------------
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        index_get = self.ledger.index.get
        hashes = as_list(block_hashes)
        if len(hashes) > _VECTOR_MIN:
            slots = list(map(index_get, hashes))
            hits = slots.index(None) if None in slots else len(slots)
            if hits:
                not_ready = self.ledger.ref_cnt[np.fromiter(slots[:hits], np.int64, hits)] < 0
                if not_ready.any():
                    hits = int(np.argmax(not_ready))
            return hits
        refs = self.ledger.refs
        hits = 0
        for block_hash in hashes:
            slot = index_get(block_hash)
            if slot is None or refs[slot] < 0:
                break
            hits += 1
        return hits

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        hashes = list(block_hashes)
        slots = self._slots_of(hashes)
        if len(slots) > _VECTOR_MIN:
            arr = np.fromiter(slots, np.int64, len(slots))
            not_ready = self.ledger.ref_cnt[arr] < 0
            if not_ready.any():
                bad = hashes[int(np.argmax(not_ready))]
                raise BlockNotReadyError(f"block {bad!r} is still being written; lookup() before prepare_load()")
            _add(self.ledger.ref_cnt, arr, slots, 1)
            return self.spec_type(arr)
        refs = self.ledger.refs
        for h, slot in zip(hashes, slots):
            if refs[slot] < 0:
                raise BlockNotReadyError(f"block {h!r} is still being written; lookup() before prepare_load()")
        for slot in slots:
            refs[slot] += 1
        return self.spec_type(slots)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        hashes = as_list(block_hashes)
        self._slots.touch_hashes(hashes)

    def on_store_miss(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        index = self.ledger.index
        missing = [h for h in block_hashes if h not in index]
        if missing:
            self.touch(missing)  # absent hashes: only ghost lists react
        return missing

    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        """Recency without reuse (see CachePolicy.refresh)."""
        hashes = as_list(block_hashes)
        self._slots.refresh_hashes(hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        hashes = list(block_hashes)
        slots = self._slots_of(hashes)
        if len(slots) > _VECTOR_MIN:
            arr = np.fromiter(slots, np.int64, len(slots))
            unpinned = self.ledger.ref_cnt[arr] <= 0
            if unpinned.any():
                bad = hashes[int(np.argmax(unpinned))]
                raise ValueError(f"complete_load for block {bad!r} without a matching prepare_load")
            _add(self.ledger.ref_cnt, arr, slots, -1)
            return
        refs = self.ledger.refs
        for h, slot in zip(hashes, slots):
            if refs[slot] <= 0:
                raise ValueError(f"complete_load for block {h!r} without a matching prepare_load")
        for slot in slots:
            refs[slot] -= 1

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        hashes = list(dict.fromkeys(block_hashes))
        ledger = self.ledger
        index = ledger.index
        new = [h for h in hashes if h not in index]
        need = len(new) - self.num_free_blocks
        evicted: list[BlockHash] = []
        evicted_slots: list[int] = []
        if need > 0:
            if need > self.num_blocks:
                return None
            victims = self._slots.evict_slots(need, set(hashes))
            if victims is None:
                return None
            slot_hashes = ledger.hashes
            evicted = [slot_hashes[slot] for slot in victims]
            for block_hash in evicted:
                del index[block_hash]
            for slot in victims:
                slot_hashes[slot] = None
            self._free_list.extend(victims)
            evicted_slots = list(victims)
            self._emit(evicted, removed=True)
        slots = self._allocate(len(new))
        refs, slot_hashes = ledger.refs, ledger.hashes
        for block_hash, slot in zip(new, slots):
            index[block_hash] = slot
            slot_hashes[slot] = block_hash
            refs[slot] = -1
        self._slots.insert_slots(slots)
        return PrepareStoreOutput(new, self.spec_type(slots), evicted, evicted_slots)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        index_get = self.ledger.index.get
        refs = self.ledger.refs
        done: list[BlockHash] = []
        for block_hash in dict.fromkeys(block_hashes):
            slot = index_get(block_hash)
            if slot is None or refs[slot] != -1:
                continue
            done.append(block_hash)
            if success:
                refs[slot] = 0
            else:
                self._slots.remove_slots([slot])
                self._forget(block_hash, slot)
        if success:
            self._emit(done, removed=False)

    def restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Re-admit ready blocks at known slots (a persistent tier reopening); only when empty."""
        if self.ledger.index or self._num_allocated:
            raise ValueError("restore() needs an empty manager")
        entries = sorted(entries, key=lambda e: e[1])
        used = {slot for _, slot in entries}
        top = max(used) + 1 if used else 0
        self._num_allocated = top
        self._free_list = [s for s in range(top - 1, -1, -1) if s not in used]  # lowest popped first
        ledger = self.ledger
        for block_hash, slot in entries:
            ledger.index[block_hash] = slot
            ledger.hashes[slot] = block_hash
            ledger.refs[slot] = 0
        slots = [slot for _, slot in entries]
        self._slots.insert_slots(slots)

    def drop(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Forget ready, unpinned blocks (found corrupt); returns the hashes dropped."""
        dropped = []
        for block_hash in block_hashes:
            slot = self.ledger.index.get(block_hash)
            if slot is None or self.ledger.refs[slot] != 0:
                continue
            self._slots.remove_slots([slot])
            self._forget(block_hash, slot)
            dropped.append(block_hash)
        self._emit(dropped, removed=True)
        return dropped

    def hash_at(self, slot: int) -> BlockHash | None:
        return self.ledger.hashes[slot]

    def take_events(self) -> list[OffloadingEvent]:
        if not self._events:
            return []
        events = list(self._events)
        self._events.clear()
        return events

    def usage(self) -> dict[str, tuple[int, int]]:
        return {self.medium.lower(): (len(self.ledger.index), self.num_blocks)}

    def busy_blocks(self) -> tuple[int, int]:
        refs = self.ledger.ref_cnt[: self._num_allocated]
        return int(np.count_nonzero(refs > 0)), int(np.count_nonzero(refs < 0))

    def contains(self, block_hash: BlockHash) -> bool:
        """Present, ready or not."""
        return block_hash in self.ledger.index

    def slot_of(self, block_hash: BlockHash) -> int | None:
        return self.ledger.index.get(block_hash)

    def is_pending(self, block_hash: BlockHash) -> bool:
        """Present but still being written (its store has not completed yet)."""
        slot = self.ledger.index.get(block_hash)
        return slot is not None and self.ledger.refs[slot] < 0

    def is_ready(self, block_hash: BlockHash) -> bool:
        slot = self.ledger.index.get(block_hash)
        return slot is not None and self.ledger.refs[slot] >= 0
