"""CachePolicy: decides which offloaded block leaves when a tier is full.

Contract (the manager relies on it):
  * ``get/insert/remove`` maintain membership; ``touch`` records use, ``hashes[0]`` ending
    most recent (a request's tail is evicted before its head).
  * ``evict(n, protected)`` returns exactly n ``(hash, BlockStatus)`` victims and forgets
    them, or returns None and changes nothing. It never picks a block whose ref_cnt != 0
    (being written or being read) nor one in ``protected``.

A policy may keep plain ``hash -> BlockStatus`` maps (the textbook way, as research policies
in ``policies/`` do). The built-in ones derive from ``LedgerCachePolicy`` instead: they keep
state in the manager's slot-indexed ``BlockLedger`` and offer slot-level fast paths.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from typing import ClassVar

from kvoffload.errors import require_positive
from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.block_status import BlockLedger, BlockStatus


class CachePolicy(ABC):
    #: True for a policy that must be told the trace's future (``OfflinePolicy``): research
    #: only; config refuses it for an engine's tier.
    needs_future: ClassVar[bool] = False

    def __init__(self, cache_capacity: int) -> None:
        require_positive("cache_capacity", cache_capacity)
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, block_hash: BlockHash) -> BlockStatus | None: ...

    @abstractmethod
    def insert(self, block_hash: BlockHash, block: BlockStatus) -> None: ...

    @abstractmethod
    def remove(self, block_hash: BlockHash) -> None: ...

    @abstractmethod
    def touch(self, block_hashes: Iterable[BlockHash]) -> None: ...

    @abstractmethod
    def evict(self, n: int, protected: Collection[BlockHash]) -> list[tuple[BlockHash, BlockStatus]] | None: ...

    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        """Recency without reuse (``hashes[0]`` most recent): a request's newly stored blocks,
        re-ranked in prefix order when it finishes (vLLM's request-scoped access). Frequency
        policies must not count it as a use; the default ignores it."""

    def admitted(self, block_hashes: list[BlockHash]) -> list[BlockHash]:
        """Of these absent blocks offered for store, the ones worth a slot, in order; the rest
        are not stored (the offer is answered as if they were). An admission policy declines
        blocks it predicts will not be reused, instead of evicting a useful block for each.
        The default admits every block."""
        return block_hashes


class OfflinePolicy(CachePolicy):
    """A policy told the trace's future (an oracle such as Belady's MIN): research only. The
    simulator (``kvoffload sim``) drives these hooks; an engine's tier config refuses it."""

    needs_future: ClassVar[bool] = True

    @abstractmethod
    def set_future(self, future: Sequence[Sequence[BlockHash]]) -> None:
        """``future[r]``: the block hashes request r references, in prefix order (once per trace)."""

    @abstractmethod
    def advance(self, request_index: int) -> None:
        """Request ``request_index`` is served next."""

    def admit(self, block_hash: BlockHash) -> bool:
        """Worth storing at all (False: bypass the cache)? By default every block is."""
        return True


class SlotPolicy(ABC):
    """The slot-level calls a manager drives a policy through (it has updated its ledger's
    index and hashes itself). Built-in policies implement them natively; any other CachePolicy
    is wrapped in ``PlainPolicySlots``, so the manager has one code path."""

    @abstractmethod
    def insert_slots(self, slots: list[int]) -> None:
        """New blocks (index and hashes already set by the caller), most recent last."""

    @abstractmethod
    def remove_slots(self, slots: list[int]) -> None:
        """Blocks leaving (still in the caller's index while this runs)."""

    @abstractmethod
    def touch_hashes(self, block_hashes: list[BlockHash]) -> None:
        """``touch`` without the per-call conversions; absent hashes are allowed."""

    @abstractmethod
    def evict_slots(self, n: int, protected: Collection[BlockHash]) -> list[int] | None:
        """Victim slots (removed from the policy, still in the caller's index), or None."""

    def refresh_hashes(self, block_hashes: list[BlockHash]) -> None:
        """``refresh`` without the per-call conversions; absent hashes are allowed."""


class LedgerCachePolicy(CachePolicy, SlotPolicy):
    """A policy whose per-block state lives in a shared BlockLedger.

    The ``*_slots`` methods are the fast paths a manager calls after it has updated the
    ledger's index itself; the hash-level methods keep the index too, for standalone use.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.ledger = BlockLedger(cache_capacity)
        self._on_bind()

    def bind_ledger(self, ledger: BlockLedger) -> None:
        """Adopt a manager's ledger; only allowed while this policy is empty."""
        if self.ledger.index:
            raise ValueError("cannot rebind a policy that already holds blocks")
        if ledger.capacity < self.cache_capacity:
            raise ValueError(f"ledger capacity {ledger.capacity} < policy capacity {self.cache_capacity}")
        self.ledger = ledger
        self._on_bind()

    def _on_bind(self) -> None:
        """(Re)create list structures over ``self.ledger``."""

    def num_ghosts(self) -> int:
        return 0

    # ---- hash-level contract -------------------------------------------------------------
    def get(self, block_hash: BlockHash) -> BlockStatus | None:
        slot = self.ledger.index.get(block_hash)
        return None if slot is None else self.ledger.status(slot)

    def insert(self, block_hash: BlockHash, block: BlockStatus) -> None:
        ledger = self.ledger
        if block._refs is not ledger.refs:
            block.bind(ledger.refs)
        ledger.index[block_hash] = block.block_id
        ledger.hashes[block.block_id] = block_hash
        self.insert_slots([block.block_id])

    def remove(self, block_hash: BlockHash) -> None:
        slot = self.ledger.index.pop(block_hash, None)
        if slot is not None:
            self.ledger.hashes[slot] = None
            self.remove_slots([slot])

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self.touch_hashes(list(block_hashes))

    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        self.refresh_hashes(list(block_hashes))

    def evict(self, n: int, protected: Collection[BlockHash]) -> list[tuple[BlockHash, BlockStatus]] | None:
        slots = self.evict_slots(n, protected)
        if slots is None:
            return None
        ledger = self.ledger
        out = []
        for slot in slots:
            block_hash = ledger.hashes[slot]
            del ledger.index[block_hash]
            ledger.hashes[slot] = None
            out.append((block_hash, BlockStatus(slot, ledger.refs[slot])))
        return out


class PlainPolicySlots(SlotPolicy):
    """The slot API over a hash-level CachePolicy (research policies keep ``hash -> status``
    maps of their own): each slot call becomes the policy's hash call on the manager's ledger."""

    __slots__ = ("ledger", "policy")

    def __init__(self, policy: CachePolicy, ledger: BlockLedger) -> None:
        self.policy = policy
        self.ledger = ledger

    def insert_slots(self, slots: list[int]) -> None:
        ledger = self.ledger
        for slot in slots:
            self.policy.insert(ledger.hashes[slot], ledger.status(slot))

    def remove_slots(self, slots: list[int]) -> None:
        for slot in slots:
            self.policy.remove(self.ledger.hashes[slot])

    def touch_hashes(self, block_hashes: list[BlockHash]) -> None:
        self.policy.touch(block_hashes)

    def refresh_hashes(self, block_hashes: list[BlockHash]) -> None:
        self.policy.refresh(block_hashes)

    def evict_slots(self, n: int, protected: Collection[BlockHash]) -> list[int] | None:
        pairs = self.policy.evict(n, protected)
        return None if pairs is None else [status.block_id for _, status in pairs]
