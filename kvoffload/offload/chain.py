"""TierChain: what the connector drives beyond the small manager contract, for a chain of tiers.

The small ``OffloadingManager`` (lookup, prepare/complete load and store, touch, events, close)
is vLLM's contract and all a single ledger needs. The chain's own operations (lookups that say
why they stopped, loads in per-tier segments, demotions, dropping corrupt records, I/O health,
a typed report) live here. A single tier is a chain of one (``as_chain``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from kvoffload.offload.abstract import BlockHash, Demotion, LoadStoreSpec, Medium, OffloadingManager, PrefixLookup
from kvoffload.offload.tier_report import ChainReport


class TierChain(OffloadingManager):
    @abstractmethod
    def lookup_prefix(self, block_hashes: Sequence[BlockHash]) -> PrefixLookup:
        """The tier of each leading hit and what stopped the run, in one pass over the chain."""

    @abstractmethod
    def is_ready(self, block_hash: BlockHash) -> bool:
        """Loadable now from some tier."""

    @abstractmethod
    def is_pending(self, block_hash: BlockHash) -> bool:
        """Present but its store has not completed: a lookup should wait a step, not recompute."""

    @abstractmethod
    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """Show the policy the offered hashes that are absent (and would be admitted), before a
        store inserts them (ARC adapts to ghost hits here); returns the hashes it was shown, so
        a caller can show each one once per request."""

    @abstractmethod
    def refresh(self, block_hashes: Sequence[BlockHash]) -> None:
        """Recency without reuse, e.g. a request's newly stored blocks."""

    @abstractmethod
    def prepare_load_segments(self, block_hashes: list[BlockHash], media: Sequence[Medium] | None = None,
                              ) -> list[tuple[LoadStoreSpec, list[BlockHash]]]:
        """``prepare_load`` for blocks that may live in several tiers: consecutive runs per tier,
        each pinned in its tier (release each with ``complete_load(hashes, spec.medium())``).
        ``media``: the tier of each block as ``lookup_prefix`` found it, so the plan does not ask
        the tiers again (a tier that no longer holds a block is then asked after all)."""

    @abstractmethod
    def take_demotions(self) -> list[Demotion]:
        """Copies into a slower tier queued since the last call (victims, write-through), in the
        order the worker must submit them: each before any later copy that overwrites its
        source slots (a victim of tier i+1 is read before tier i's victim takes its slot)."""

    @abstractmethod
    def has_pending_demotions(self) -> bool: ...

    @abstractmethod
    def complete_demotion(self, block_hashes: list[BlockHash], success: bool, medium: str) -> None:
        """A demotion's copy into ``medium`` (the destination tier) landed, or failed: its
        destination slots are freed."""

    @abstractmethod
    def drop_corrupt(self, medium: str, slots: list[int]) -> int:
        """Forget blocks a read found corrupt, misplaced or unreadable; returns how many."""

    @abstractmethod
    def record_io(self, medium: str, ok: bool, write: bool = False) -> None:
        """A read from (write to) ``medium`` succeeded or failed with an I/O error; repeated
        errors may take that tier out of service."""

    @abstractmethod
    def report(self) -> ChainReport:
        """Every tier's state and counters, fastest first."""
