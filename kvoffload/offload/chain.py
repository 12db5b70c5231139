"""TierChain: what the connector drives beyond the small manager contract, for a chain of tiers.

The small ``OffloadingManager`` (lookup, prepare/complete load and store, touch, events, close)
is vLLM's contract and all a single ledger needs. The chain's own operations (lookups that say
why they stopped, loads in per-tier segments, demotions, dropping corrupt records, I/O health,
a typed report) live here, each with a default for a chain that has nothing to do there (no
demotions, no records to find corrupt), written over the small contract. Every chain is a
``…TierChain``: ``HostTierChain`` (the host tier in front of the slower ones) is the one specs
build, ``EmptyTierChain`` the one with nothing to offload; a lone tier becomes a chain of one
(``as_chain``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.offload.abstract import (
    BlockHash,
    Demotion,
    KeyProbes,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingManager,
    PrefixLookup,
    as_list,
)
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.slot_table import SlotTable
from kvoffload.offload.tier_index import EmptyIndex, TierIndex
from kvoffload.offload.tier_report import ChainReport, TierReport


class TierChain(OffloadingManager):
    #: The index of the tier stores land in first (the host tier): its policy is the one vLLM's
    #: per-request recency (``refresh``, ``touch`` of what a request reused) informs. A chain
    #: without one (nothing to offload) reads as empty.
    host: TierIndex = EmptyIndex()

    def lookup_prefix(self, block_hashes: Sequence[BlockHash]) -> PrefixLookup:
        """The tier of each leading hit and what stopped the run, in one pass over the chain."""
        hashes = as_list(block_hashes)
        hits = self.lookup(hashes)
        if hits is None:
            return PrefixLookup([], LookupResult.RETRY)
        return PrefixLookup([self.medium] * hits, LookupResult.HIT if hits == len(hashes) else LookupResult.MISS)

    def is_ready(self, block_hash: BlockHash) -> bool:
        """Loadable now from some tier."""
        return self.lookup([block_hash]) == 1

    def is_pending(self, block_hash: BlockHash) -> bool:
        """Present but its store has not completed: a lookup should wait a step, not recompute."""
        return False

    def key_probes(self) -> KeyProbes:
        """``(is_ready, is_pending)`` as the cheapest callables that answer them for one key
        (vLLM asks one key per call); ``is_pending`` is asked only of a key not ready."""
        return self.is_ready, self.is_pending

    def sole_table(self) -> SlotTable | None:
        """The host tier's slot table when the chain is that table and nothing more: one tier,
        whose writes queue no events, keep no I/O health and add nothing to the table's (no
        subclass, such as the reuse filter, changing a verb). A caller making many small calls
        (vLLM's adapter) may then write to the table itself. None otherwise (the default)."""
        return None

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """Show the policy the offered hashes that are absent (and would be admitted), before a
        store inserts them (ARC adapts to ghost hits here); returns the hashes it was shown, so
        a caller can show each one once per request."""
        return []

    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None:
        """What the caller knows of the future of the request using these blocks (session,
        expected return, priority, lease): every tier's policy sees it (default: nothing)."""

    def prepare_load_segments(self, block_hashes: list[BlockHash], media: Sequence[Medium] | None = None,
                              ) -> list[tuple[LoadStoreSpec, list[BlockHash]]]:
        """``prepare_load`` for blocks that may live in several tiers: consecutive runs per tier,
        each pinned in its tier (release each with ``complete_load(hashes, spec.medium())``).
        ``media``: the tier of each block as ``lookup_prefix`` found it, so the plan does not ask
        the tiers again (a tier that no longer holds a block is then asked after all)."""
        hashes = list(block_hashes)
        return [(self.prepare_load(hashes), hashes)] if hashes else []

    def take_demotions(self) -> list[Demotion]:
        """Copies into a slower tier queued since the last call (victims, write-through), in the
        order the worker must submit them: each before any later copy that overwrites its
        source slots (a victim of tier i+1 is read before tier i's victim takes its slot)."""
        return []

    def has_pending_demotions(self) -> bool:
        return False

    def complete_demotion(self, block_hashes: list[BlockHash], success: bool, medium: str) -> None:
        """A demotion's copy into ``medium`` (the destination tier) landed, or failed: its
        destination slots are freed."""
        raise ValueError(f"complete_demotion into {medium!r}: this chain has no tier behind {self.medium}")

    def drop_corrupt(self, medium: str, slots: list[int]) -> int:
        """Forget blocks a read found corrupt, misplaced or unreadable; returns how many."""
        return 0

    def record_io(self, medium: str, ok: bool, write: bool = False) -> None:
        """A read from (write to) ``medium`` succeeded or failed with an I/O error; repeated
        errors may take that tier out of service."""

    def report(self) -> ChainReport:
        """Every tier's state and counters, fastest first."""
        return ChainReport([TierReport(self.medium, 0, 0)])
