"""ChainOfOne and as_chain: any OffloadingManager seen as a TierChain.

A manager that knows only the small contract (a user's, an empty one) is a chain of one tier
that never demotes, never finds a record corrupt and cannot say a block is being written. A
LedgerTier is a chain of one through the chain itself; a chain is itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import (
    BlockHash,
    Demotion,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    PrefixLookup,
    PrepareStoreOutput,
    as_list,
)
from kvoffload.offload.chain import TierChain
from kvoffload.offload.ledger_tier import LedgerTier
from kvoffload.offload.tier_report import ChainReport, TierReport
from kvoffload.offload.tiered_manager import TieredOffloadingManager


def as_chain(manager: OffloadingManager) -> TierChain:
    if isinstance(manager, TierChain):
        return manager
    if isinstance(manager, LedgerTier):
        return TieredOffloadingManager(manager)
    return ChainOfOne(manager)


class ChainOfOne(TierChain):
    def __init__(self, manager: OffloadingManager) -> None:
        self.manager = manager
        self.medium = manager.medium
        self.block_size = manager.block_size

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int | None:
        return self.manager.lookup(block_hashes)

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        return self.manager.prepare_load(block_hashes)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self.manager.touch(block_hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        self.manager.complete_load(block_hashes)

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        return self.manager.prepare_store(block_hashes)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        self.manager.complete_store(block_hashes, success)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.manager.take_events()

    def close(self) -> None:
        self.manager.close()

    def lookup_prefix(self, block_hashes: Sequence[BlockHash]) -> PrefixLookup:
        hashes = as_list(block_hashes)
        hits = self.manager.lookup(hashes)
        if hits is None:
            return PrefixLookup([], LookupResult.RETRY)
        return PrefixLookup([self.medium] * hits, LookupResult.HIT if hits == len(hashes) else LookupResult.MISS)

    def is_ready(self, block_hash: BlockHash) -> bool:
        return self.manager.lookup([block_hash]) == 1

    def is_pending(self, block_hash: BlockHash) -> bool:
        return False  # the small contract cannot tell

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        return []

    def refresh(self, block_hashes: Sequence[BlockHash]) -> None:
        pass

    def prepare_load_segments(self, block_hashes: list[BlockHash], media: Sequence[Medium] | None = None,
                              ) -> list[tuple[LoadStoreSpec, list[BlockHash]]]:
        hashes = list(block_hashes)
        return [(self.manager.prepare_load(hashes), hashes)]

    def take_demotions(self) -> list[Demotion]:
        return []

    def has_pending_demotions(self) -> bool:
        return False

    def complete_demotion(self, block_hashes: list[BlockHash], success: bool, medium: str) -> None:
        raise ValueError(f"complete_demotion into {medium!r}: a chain of one tier demotes nothing")

    def drop_corrupt(self, medium: str, slots: list[int]) -> int:
        return 0

    def record_io(self, medium: str, ok: bool, write: bool = False) -> None:
        pass

    def report(self) -> ChainReport:
        return ChainReport([TierReport(self.medium, 0, 0)])
