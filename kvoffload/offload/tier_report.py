"""TierReport and ChainReport: what a chain of tiers says about itself, as typed records.

Metrics, ``kvoffload run`` and vLLM's stats read these fields directly; nothing builds or parses
medium-prefixed counter names, so a new tier kind reports like every other one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class TierReport:
    """One tier, now. Counters a tier does not keep stay 0."""

    medium: str
    #: Blocks held (ready or being written) and the tier's capacity, in offloaded blocks.
    blocks_used: int
    capacity_blocks: int
    #: Blocks pinned by loads, and blocks being written: what no store can evict.
    pinned_blocks: int = 0
    writing_blocks: int = 0
    in_service: bool = True
    #: Records a read found corrupt, misplaced or unreadable, and dropped.
    corrupt_blocks: int = 0
    #: Failed copies into or out of the tier, and times it was taken out of service for them.
    io_errors: int = 0
    outages: int = 0
    #: Blocks found intact in a persistent tier when it opened.
    blocks_recovered: int = 0
    #: A shared store's batched lookups: queries sent, blocks they found, lookups that waited
    #: a step, and lookups given up as misses.
    lookup_queries: int = 0
    lookup_hit_blocks: int = 0
    lookups_deferred: int = 0
    lookups_given_up: int = 0

    @property
    def name(self) -> str:
        """The tier as metrics label it: the medium in lower case ("cpu", "disk")."""
        return self.medium.lower()


@dataclass(frozen=True, slots=True)
class ChainReport:
    """Every tier of a chain, fastest first, and what the chain itself counts."""

    tiers: list[TierReport] = field(default_factory=list)
    #: Victims and written-through blocks a slower tier could not take (full or out of service).
    demotions_dropped: int = 0
    #: Whether a reuse filter stands in front of the chain, and the offers it kept out.
    reuse_filter: bool = False
    filter_skipped_blocks: int = 0

    @property
    def corrupt_blocks(self) -> int:
        return sum(t.corrupt_blocks for t in self.tiers)

    def tier(self, name: str) -> TierReport | None:
        """The tier called ``name`` ("disk" or "DISK"); None when the chain has none."""
        wanted = name.lower()
        return next((t for t in self.tiers if t.name == wanted), None)

    def with_filter(self, skipped: int) -> ChainReport:
        return replace(self, reuse_filter=True, filter_skipped_blocks=skipped)
