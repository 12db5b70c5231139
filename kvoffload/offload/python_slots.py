"""PythonSlotTable: the slot table in Python, for any CachePolicy (the reference implementation;
``NativeSlotTable`` keeps the same table in C for the policies it implements)."""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import BlockHash, BlockNotReadyError, as_list
from kvoffload.offload.block_status import SlotArrays
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.policy import CachePolicy
from kvoffload.offload.policy_registry import create_policy
from kvoffload.offload.slot_table import LedgerSnapshot, Shown, SlotTable, StoreSlots
from kvoffload.registry import PolicyRef

logger = logging.getLogger("kvoffload")


class PythonSlotTable(SlotTable):
    def __init__(self, capacity: int, cache_policy: str | PolicyRef | CachePolicy, medium: str) -> None:
        super().__init__(capacity, medium)
        self.ledger = SlotArrays(capacity)
        self._policy = create_policy(cache_policy, capacity)
        self._policy.bind_ledger(self.ledger)
        self._hints_failed = False
        self._num_allocated = 0
        self._free_list: list[int] = []

    def debug_snapshot(self) -> LedgerSnapshot:
        """The ledger's state (tests, debugging; the native ledger's is a copy)."""
        return self.ledger

    @property
    def policy(self) -> object:
        """The eviction policy's state (the CachePolicy, or a view of the native one)."""
        return self._policy

    @property
    def num_free(self) -> int:
        return len(self._free_list) + self.capacity - self._num_allocated

    @property
    def num_used(self) -> int:
        return len(self.ledger.index)

    def _take_slots(self, n: int) -> list[int]:
        fresh = min(n, self.capacity - self._num_allocated)
        slots = list(range(self._num_allocated, self._num_allocated + fresh))
        self._num_allocated += fresh
        reused = n - fresh
        if reused:
            free = self._free_list
            slots.extend(free[: -reused - 1 : -1])  # last freed first
            del free[-reused:]
        return slots

    def _free(self, block_hash: BlockHash, slot: int) -> None:
        del self.ledger.index[block_hash]
        self.ledger.hashes[slot] = None
        self.ledger.refs[slot] = 0  # a free slot counts as neither read nor written
        self._free_list.append(slot)

    def _slots_of(self, block_hashes: list[BlockHash]) -> list[int]:
        index = self.ledger.index
        try:
            return list(map(index.__getitem__, block_hashes))
        except KeyError as exc:
            raise BlockNotReadyError(f"block {exc.args[0]!r} is not stored in the {self.medium} tier") from None

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        index_get = self.ledger.index.get
        refs = self.ledger.refs
        hits = 0
        for block_hash in block_hashes:
            slot = index_get(block_hash)
            if slot is None or refs[slot] < 0:
                break
            hits += 1
        return hits

    def pin(self, block_hashes: list[BlockHash]) -> Sequence[int]:
        """Slots of ready blocks, each pinned once more; raises BlockNotReadyError, pinning
        nothing, when one is absent or being written."""
        slots = self._slots_of(block_hashes)
        refs = self.ledger.refs
        for h, slot in zip(block_hashes, slots):
            if refs[slot] < 0:
                raise BlockNotReadyError(f"block {h!r} is still being written; lookup() before prepare_load()")
        for slot in slots:
            refs[slot] += 1
        return slots

    def unpin(self, block_hashes: list[BlockHash]) -> None:
        """Release one pin of each block; ValueError, changing nothing, for a block not pinned."""
        slots = self._slots_of(block_hashes)
        refs = self.ledger.refs
        for i, (h, slot) in enumerate(zip(block_hashes, slots)):  # a block given twice needs two pins
            if refs[slot] <= 0:
                for earlier in slots[:i]:
                    refs[earlier] += 1
                raise ValueError(f"complete_load for block {h!r} without a matching prepare_load")
            refs[slot] -= 1

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self._policy.touch_hashes(list(block_hashes))

    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        """Recency without reuse (see CachePolicy.refresh)."""
        self._policy.refresh_hashes(list(block_hashes))

    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None:
        """Hints are advice, given from a request's lookup and finish: a policy whose ``hint``
        raises (a user's policy; the shipped ones never do) must not fail the request, so the
        error is logged once, with its cause, and the tier stops giving hints to that policy
        (a half-applied hint may have left it unable to take more); it still orders blocks by
        its other calls."""
        if self._hints_failed:
            return
        try:
            self._policy.hint(block_hashes, hint)
        except Exception:  # user code at a boundary: any error is the policy's
            self._hints_failed = True
            logger.exception("kvoffload: eviction policy %s raised in hint(): hints are off for the %s tier from "
                             "now on (its blocks are still ordered by the policy's other calls); fix the policy's "
                             "hint() or use a shipped policy", type(self._policy).__name__, self.medium)

    def store_miss(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Show the policy the absent hashes about to be stored (ghost hits); returns them."""
        index = self.ledger.index
        missing = [h for h in block_hashes if h not in index]
        if missing:
            self.touch(missing)  # absent hashes: only ghost lists react
        return missing

    def allocate(self, block_hashes: Iterable[BlockHash], shown: Shown | None = None,
                 victim_slots: bool = True) -> StoreSlots | None:
        """Slots for the absent hashes, inserted being written, evicting (never a pinned,
        written or offered block) when the free slots are too few; None and no change at all
        when eviction cannot free enough. ``shown``: see SlotTable.allocate."""
        offered = as_list(block_hashes)
        if isinstance(shown, set):
            shown.update(self.store_miss([h for h in offered if h not in shown]))
        elif shown is not None:
            shown.extend(self.store_miss(offered))
        hashes = list(dict.fromkeys(offered))
        ledger = self.ledger
        index = ledger.index
        new = [h for h in hashes if h not in index]
        if new:
            new = self._policy.admitted(new)
        need = len(new) - self.num_free
        evicted: list[BlockHash] = []
        evicted_slots: list[int] = []
        if need > 0:
            if need > self.capacity:
                return None
            victims = self._policy.evict_slots(need, set(hashes))
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
        slots = self._take_slots(len(new))
        refs, slot_hashes = ledger.refs, ledger.hashes
        for block_hash, slot in zip(new, slots):
            index[block_hash] = slot
            slot_hashes[slot] = block_hash
            refs[slot] = -1
        self._policy.insert_slots(slots)
        return StoreSlots(new, slots, evicted, evicted_slots)

    def complete(self, block_hashes: Iterable[BlockHash], success: bool) -> list[BlockHash]:
        """Blocks being written become ready (or are freed on failure); returns those changed."""
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
                self._policy.remove_slots([slot])
                self._free(block_hash, slot)
        return done

    def restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Re-admit ready blocks at known slots (a persistent tier reopening); only when empty."""
        if self.ledger.index or self._num_allocated:
            raise ValueError("restore() needs an empty ledger")
        # Checked in the native ledger's order, with its words: each slot converted once, in
        # range, then keys distinct, then slots distinct; a refused restore changes nothing.
        entries = sorted(((h, operator.index(slot)) for h, slot in entries), key=lambda e: e[1])
        for _, slot in entries:
            if not 0 <= slot < self.capacity:
                raise ValueError(f"restore(): slot {slot} is out of range 0..{self.capacity - 1}")
        seen: set[BlockHash] = set()
        for i, (h, _) in enumerate(entries):
            if h in seen:
                raise ValueError(f"restore(): key at position {i} is given twice")
            seen.add(h)
        used = {slot for _, slot in entries}
        if len(used) < len(entries):
            twice = next(b for (_, a), (_, b) in itertools.pairwise(entries) if a == b)
            raise ValueError(f"restore(): slot {twice} is given twice")
        top = max(used) + 1 if used else 0
        self._num_allocated = top
        self._free_list = [s for s in range(top - 1, -1, -1) if s not in used]  # lowest popped first
        ledger = self.ledger
        for block_hash, slot in entries:
            ledger.index[block_hash] = slot
            ledger.hashes[slot] = block_hash
            ledger.refs[slot] = 0
        self._policy.insert_slots([slot for _, slot in entries])

    def forget_ready(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Forget ready, unpinned blocks, without an event; returns those forgotten."""
        dropped = []
        for block_hash in block_hashes:
            slot = self.ledger.index.get(block_hash)
            if slot is None or self.ledger.refs[slot] != 0:
                continue
            self._policy.remove_slots([slot])
            self._free(block_hash, slot)
            dropped.append(block_hash)
        return dropped

    def hash_at(self, slot: int) -> BlockHash | None:
        return self.ledger.hashes[slot]

    def slot_of(self, block_hash: BlockHash) -> int | None:
        return self.ledger.index.get(block_hash)

    def contains(self, block_hash: BlockHash) -> bool:
        return block_hash in self.ledger.index

    def is_ready(self, block_hash: BlockHash) -> bool:
        slot = self.ledger.index.get(block_hash)
        return slot is not None and self.ledger.refs[slot] >= 0

    def is_pending(self, block_hash: BlockHash) -> bool:
        slot = self.ledger.index.get(block_hash)
        return slot is not None and self.ledger.refs[slot] < 0

    def busy(self) -> tuple[int, int]:
        """Blocks pinned by loads, and blocks being written."""
        refs = self.ledger.ref_cnt[: self._num_allocated]
        return int((refs > 0).sum()), int((refs < 0).sum())

