"""CachePolicy: decides which offloaded block leaves when a tier is full.

Contract (the tier relies on it):
  * ``get/insert/remove`` maintain membership; ``touch`` records use, ``hashes[0]`` ending
    most recent (a request's tail is evicted before its head).
  * ``evict(n, protected)`` returns exactly n ``(hash, BlockStatus)`` victims and forgets
    them, or returns None and changes nothing. It never picks a block whose ref_cnt != 0
    (being written or being read) nor one in ``protected``.

A tier drives every policy through its slot-level calls (``insert_slots``, ``evict_slots``, ...),
after updating its slot-indexed ``SlotArrays`` itself. A policy may keep plain
``hash -> BlockStatus`` maps (the textbook way, as research policies in ``policies/`` do): the
slot calls' defaults turn into its hash-level calls. The built-in ones derive from
``LedgerCachePolicy`` instead, the fast path: their state lives in the tier's ledger and they
implement the slot calls directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from typing import ClassVar

from kvoffload.errors import require_positive
from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.block_status import BlockStatus, SlotArrays
from kvoffload.offload.hints import BlockHint


class CachePolicy(ABC):
    #: True for a policy that must be told the trace's future (``OfflinePolicy``): research
    #: only; config refuses it for an engine's tier.
    needs_future: ClassVar[bool] = False
    #: The tier's ledger once it binds the policy (a class default: a plugin's __init__ may
    #: not call this one's).
    _tier_ledger: SlotArrays | None = None

    def __init__(self, cache_capacity: int) -> None:
        require_positive("cache_capacity", cache_capacity)
        self.cache_capacity = cache_capacity

    def bind_ledger(self, ledger: SlotArrays) -> None:
        """The tier's ledger, which the slot calls below read (the tier owns and updates it)."""
        self._tier_ledger = ledger

    def _bound(self) -> SlotArrays:
        if self._tier_ledger is None:
            raise RuntimeError(f"{type(self).__name__}: a slot call before a tier bound its ledger (bind_ledger)")
        return self._tier_ledger

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

    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None:
        """What the caller of the request using these blocks (prefix order) knows of its future:
        its session, when it expects the session back, its priority and lease. Policies that
        learn from sightings alone ignore it (the default)."""

    def admitted(self, block_hashes: list[BlockHash]) -> list[BlockHash]:
        """Of these absent blocks offered for store, the ones worth a slot, in order; the rest
        are not stored (the offer is answered as if they were). An admission policy declines
        blocks it predicts will not be reused, instead of evicting a useful block for each.
        The default admits every block."""
        return block_hashes

    # ---- the slot-level calls a tier drives (it updated its ledger's index and hashes) -------
    # The defaults turn each into the hash-level call; LedgerCachePolicy implements them natively.
    def insert_slots(self, slots: list[int]) -> None:
        """New blocks (index and hashes already set by the tier), most recent last."""
        ledger = self._bound()
        for slot in slots:
            self.insert(ledger.hashes[slot], ledger.status(slot))

    def remove_slots(self, slots: list[int]) -> None:
        """Blocks leaving (still in the tier's index while this runs)."""
        hashes = self._bound().hashes
        for slot in slots:
            self.remove(hashes[slot])

    def touch_hashes(self, block_hashes: list[BlockHash]) -> None:
        """``touch`` without the per-call conversions; absent hashes are allowed."""
        self.touch(block_hashes)

    def refresh_hashes(self, block_hashes: list[BlockHash]) -> None:
        """``refresh`` without the per-call conversions; absent hashes are allowed."""
        self.refresh(block_hashes)

    def evict_slots(self, n: int, protected: Collection[BlockHash]) -> list[int] | None:
        """Victim slots (forgotten by the policy, still in the tier's index), or None."""
        pairs = self.evict(n, protected)
        return None if pairs is None else [status.block_id for _, status in pairs]


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


class LedgerCachePolicy(CachePolicy):
    """A policy whose per-block state lives in the tier's SlotArrays: the fast path.

    Its ``*_slots`` methods work on the ledger directly (no per-block hash call); the
    hash-level methods keep the index too, for standalone use.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.ledger = SlotArrays(cache_capacity)
        self._on_bind()

    def bind_ledger(self, ledger: SlotArrays) -> None:
        """Adopt the tier's ledger; only allowed while this policy is empty."""
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
