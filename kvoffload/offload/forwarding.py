"""ForwardingTierChain: the base of decorators of a chain (reuse filter, recorders).

Every method of the TierChain contract goes to ``backing`` explicitly, so a decorator overrides
only what it intercepts and can never fall back to a default by accident (a test checks each
method reaches the backing chain). Any manager can be decorated: it is seen as a chain first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import (
    BlockHash,
    Demotion,
    LoadStoreSpec,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    PrefixLookup,
    PrepareStoreOutput,
)
from kvoffload.offload.chain import TierChain
from kvoffload.offload.chain_of_one import as_chain
from kvoffload.offload.tier_report import ChainReport


class ForwardingTierChain(TierChain):
    def __init__(self, backing: OffloadingManager) -> None:
        self.backing = as_chain(backing)
        self.medium = backing.medium  # fixed for a manager's life
        self.block_size = backing.block_size

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int | None:
        return self.backing.lookup(block_hashes)

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        return self.backing.prepare_load(block_hashes)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self.backing.touch(block_hashes)

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        return self.backing.on_store_miss(block_hashes)

    def refresh(self, block_hashes: Sequence[BlockHash]) -> None:
        self.backing.refresh(block_hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        self.backing.complete_load(block_hashes, medium)

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        return self.backing.prepare_store(block_hashes)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        self.backing.complete_store(block_hashes, success)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.backing.take_events()

    def close(self) -> None:
        self.backing.close()

    def lookup_prefix(self, block_hashes: Sequence[BlockHash]) -> PrefixLookup:
        return self.backing.lookup_prefix(block_hashes)

    def is_ready(self, block_hash: BlockHash) -> bool:
        return self.backing.is_ready(block_hash)

    def is_pending(self, block_hash: BlockHash) -> bool:
        return self.backing.is_pending(block_hash)

    def prepare_load_segments(self, block_hashes: list[BlockHash], media: Sequence[Medium] | None = None,
                              ) -> list[tuple[LoadStoreSpec, list[BlockHash]]]:
        return self.backing.prepare_load_segments(block_hashes, media)

    def take_demotions(self) -> list[Demotion]:
        return self.backing.take_demotions()

    def has_pending_demotions(self) -> bool:
        return self.backing.has_pending_demotions()

    def complete_demotion(self, block_hashes: list[BlockHash], success: bool, medium: str) -> None:
        self.backing.complete_demotion(block_hashes, success, medium)

    def drop_corrupt(self, medium: str, slots: list[int]) -> int:
        return self.backing.drop_corrupt(medium, slots)

    def record_io(self, medium: str, ok: bool, write: bool = False) -> None:
        self.backing.record_io(medium, ok, write)

    def report(self) -> ChainReport:
        return self.backing.report()
