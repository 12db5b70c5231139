"""EmptyTierChain: a tier of zero blocks, for a worker with no KV bytes to offload
(vLLM builds an empty cache then, rather than failing start-up)."""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.offload.abstract import BlockHash, BlockNotReadyError, LoadStoreSpec, PrepareStoreOutput
from kvoffload.offload.chain import TierChain
from kvoffload.offload.mediums import CPULoadStoreSpec


class EmptyTierChain(TierChain):
    def __init__(self, block_size: int = 0) -> None:
        self.block_size = block_size

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        return 0

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        hashes = list(block_hashes)
        if hashes:
            raise BlockNotReadyError(f"block {hashes[0]!r} is not stored: this tier holds no blocks")
        return CPULoadStoreSpec([])

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        if list(block_hashes):
            return None  # no slot to put anything in
        return PrepareStoreOutput([], CPULoadStoreSpec([]), [])
