"""FilterReusedOffloadingManager: store a block only once it has been offered N times.

Most blocks of a serving workload are never reused; writing them to a tier costs bandwidth
and evicts blocks that would have hit. A *sighting* is one request offering a block for
store (the connector offers each full block of a request once). Prefix lookups are not
counted: they stop at the first miss, so a lookup-fed counter needs ~2N+1 repeats to warm an
N-block prefix. Counts live in an LRU-bounded tracker; a call whose backing store answers
None leaves every count unchanged, so the connector's retry is not counted twice.

It is the tier chain itself with stores filtered, not a wrapper forwarding every call to one:
built over the tiers of the chain (or the tier) it is given, it takes that chain's place (use
the filter from then on; the chain given has no part in it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import BlockHash, OffloadingManager, PrepareStoreOutput
from kvoffload.offload.host_tier_chain import HostTierChain, as_chain
from kvoffload.offload.tier_report import ChainReport


class FilterReusedOffloadingManager(HostTierChain):
    def __init__(self, backing: OffloadingManager, store_threshold: int = 2, max_tracker_size: int = 64_000) -> None:
        if store_threshold < 2:
            raise ValueError(f"store_threshold={store_threshold}: the reuse filter needs >= 2 (use the backing manager directly)")
        if max_tracker_size < 1:
            raise ValueError(f"max_tracker_size={max_tracker_size}: must be >= 1")
        chain = as_chain(backing)
        if not isinstance(chain, HostTierChain):
            raise TypeError(f"FilterReusedOffloadingManager over a {type(backing).__name__}: give it a tier or a "
                            "HostTierChain")
        primary, secondaries, write_through = chain.same_tiers()
        super().__init__(primary, *secondaries, write_through=write_through)
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[BlockHash, int] = OrderedDict()
        self.num_filtered = 0

    def _admits(self, block_hash: BlockHash) -> bool:
        """This offer (counted) would reach the threshold."""
        return self.counts.get(block_hash, 0) + 1 >= self.store_threshold

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        # The policy sees only candidates this offer admits (vLLM shows ARC nothing else).
        return super().on_store_miss([h for h in block_hashes if self._admits(h)])

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        hashes = list(dict.fromkeys(block_hashes))
        counts = self.counts
        admitted = [h for h in hashes if self._admits(h)]
        # Offers already stored (ready or being written) are not stores the filter skipped.
        skipped = sum(1 for h in hashes if not self._admits(h) and not (self.is_ready(h) or self.is_pending(h)))
        result = super().prepare_store(admitted)
        if result is None:
            return None
        for h in hashes:
            if h in counts:
                counts[h] += 1
                counts.move_to_end(h)
            else:
                if len(counts) >= self.max_tracker_size:
                    counts.popitem(last=False)
                counts[h] = 1
        self.num_filtered += skipped
        return result

    def report(self) -> ChainReport:
        return super().report().with_filter(self.num_filtered)
