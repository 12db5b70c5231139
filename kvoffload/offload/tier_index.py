"""TierIndex: the one object that answers a tier's reads — which blocks it holds, ready or
being written, in which slot — and takes the recency a read implies (touch, refresh, hints).

A chain reads each tier through its index, never through the tier: a ledger tier's index is its
slot table (the C one's methods are C callables), and a shared store tier, whose ledger is the
store, answers for itself. What a tier does beyond reading (writes, pins, I/O health, events,
its report) stays the tier's. One interface on the read path, so a lookup reaches the ledger
without a Python frame per layer. Tensor-free, like everything scheduler-side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import BlockHash, KeyProbes
from kvoffload.offload.hints import BlockHint


class TierIndex(ABC):
    @abstractmethod
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int | None:
        """How many leading hashes are present and ready (None: ask again next step)."""

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

    def key_probes(self) -> KeyProbes:
        """``(is_ready, is_pending)`` as the cheapest callables that answer them for one key
        (vLLM asks one key per call; the native table's are C's)."""
        return self.is_ready, self.is_pending

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Mark blocks reused; ``block_hashes[0]`` ends up the most recent (default: nothing)."""

    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        """Recency without reuse, e.g. a request's newly stored blocks (default: nothing)."""

    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None:
        """A request's hint for its blocks (see CachePolicy.hint; default: nothing)."""

    def store_miss(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Show the policy the offered hashes that are absent, before a store inserts them (ARC
        adapts to ghost hits here); returns those shown. Default: nothing."""
        return []


class EmptyIndex(TierIndex):
    """The reads of a tier that holds nothing."""

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        return 0

    def is_ready(self, block_hash: BlockHash) -> bool:
        return False

    def is_pending(self, block_hash: BlockHash) -> bool:
        return False

    def contains(self, block_hash: BlockHash) -> bool:
        return False

    def slot_of(self, block_hash: BlockHash) -> int | None:
        return None
