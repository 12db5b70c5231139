"""ChainWrites: a chain's writes in a slot table's words (``allocate``, ``complete``, ``pin``,
``unpin``, ``touch``), so a caller that speaks those (vLLM's adapter) drives a chain of several
tiers, events or a reuse filter the same way it drives a sole table (``TierChain.sole_table``)
directly. Tensor-free, like everything scheduler-side.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.offload.abstract import BlockHash, SlotIds, as_list
from kvoffload.offload.chain import TierChain
from kvoffload.offload.slot_table import Shown, StoreSlots


class ChainWrites:
    def __init__(self, chain: TierChain) -> None:
        self._chain = chain
        self.touch = chain.touch

    def allocate(self, block_hashes: Iterable[BlockHash], shown: Shown | None = None,
                 victim_slots: bool = True) -> StoreSlots | None:
        """The chain's store, as ``SlotTable.allocate`` answers it (``shown``: the absent
        hashes are shown to the host policy first; see there)."""
        hashes = as_list(block_hashes)
        if isinstance(shown, set):
            fresh = [h for h in hashes if h not in shown] if shown else hashes
            if fresh:
                shown.update(self._chain.on_store_miss(fresh))
        elif shown is not None and hashes:
            shown.extend(self._chain.on_store_miss(hashes))
        out = self._chain.prepare_store(hashes)
        if out is None:
            return None
        return StoreSlots(out.block_hashes_to_store, out.store_spec.block_ids, out.block_hashes_evicted,
                          out.evicted_block_ids)

    def complete(self, block_hashes: Iterable[BlockHash], success: bool) -> list[BlockHash]:
        """Finish stores (see ``complete_store``); returns the hashes given, as a list."""
        hashes = as_list(block_hashes)
        self._chain.complete_store(hashes, success)
        return hashes

    def pin(self, block_hashes: list[BlockHash]) -> SlotIds:
        """Slots of a load from the host tier (a chain's blocks in other tiers are refused)."""
        return self._chain.prepare_load(block_hashes).block_ids

    def unpin(self, block_hashes: list[BlockHash]) -> None:
        self._chain.complete_load(block_hashes)
