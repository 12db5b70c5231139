"""TieredOffloadingSpec: a CPU DRAM tier, then any chain of secondary tiers behind it (each a
TierKind plugin), optionally the reuse filter in front of them all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvoffload.errors import ConfigError
from kvoffload.offload.abstract import LoadStoreSpec, Medium, OffloadingManager
from kvoffload.offload.chain import TierChain
from kvoffload.offload.cpu_tier import CPUTier
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager
from kvoffload.offload.spec import OffloadingSpec
from kvoffload.registry import TIER_KINDS
from kvoffload.tiers.base import TierContext, TierKind
from kvoffload.transfer.tier_io import TierIO


class TieredOffloadingSpec(OffloadingSpec):
    def num_blocks_per_tier(self) -> list[int]:
        """A tier's ``capacity`` is its total over all ranks (like vLLM's ``cpu_bytes_to_use``):
        under tensor parallelism each rank holds its shard of every block, capacity / world_size."""
        return self.config.tier_blocks(self.offloaded_block_bytes * self.kv_info.world_size, self.kv_info.world_size)

    def tier_kinds(self) -> list[TierKind]:
        """The secondary tiers, in chain order, as their kinds' plugins."""
        blocks = self.num_blocks_per_tier()
        info = self.kv_info
        kinds = []
        for i, tier in enumerate(self.config.tiers[1:], start=1):
            ctx = TierContext(tier, f"tiers[{i}]", blocks[i], self.offloaded_block_bytes, self.offloaded_block_size,
                              info.layout_digest, info.world_size, info.rank, self.config.metrics.events,
                              info.namespace, self.config.auth)
            kinds.append(TIER_KINDS.load(tier.medium)(ctx))
        return kinds

    def get_manager(self) -> OffloadingManager:
        try:
            return self._build_manager()
        except MemoryError:
            blocks = self.num_blocks_per_tier()
            raise ConfigError(f"tiers: {max(blocks)} blocks per tier are too many to track in this process's memory; "
                              "lower the capacity or raise offloaded_block_size") from None

    def _build_manager(self) -> OffloadingManager:
        cfg = self.config
        cpu = CPUTier(
            self.num_blocks_per_tier()[0],
            cache_policy=cfg.tiers[0].cache_policy,
            enable_events=cfg.metrics.events,
            block_size=self.offloaded_block_size,
        )
        secondaries = []
        try:
            for kind in self.tier_kinds():
                secondaries.append(kind.build_manager())
        except BaseException:
            for tier in secondaries:
                tier.close()
            raise
        manager: TierChain = HostTierChain(cpu, *secondaries,
                                                     write_through=[t.write_through for t in cfg.tiers[1:]])
        if cfg.store_threshold >= 2:
            manager = FilterReusedOffloadingManager(manager, cfg.store_threshold, cfg.max_tracker_size)
        return manager

    def get_handlers(self, kv_caches: Any) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], Any]]:
        """Device <-> host handlers over a CanonicalKVCache, then one handler per secondary tier
        (host → tier, tier above → tier, tier → device). The worker half's modules (torch) are
        imported here: the scheduler process builds this spec too, for its manager alone."""
        from kvoffload.transfer.device_host_handler import DeviceHostHandler
        from kvoffload.transfer.host_buffer import HostBlockBuffer
        from kvoffload.transfer.secondary_handler import SecondaryTierHandler
        from kvoffload.transfer.slot_fence import SlotFences
        from kvoffload.transfer.streams import make_stream_pool

        if kv_caches.page_bytes * self.block_size_factor != self.offloaded_block_bytes:
            raise ValueError(
                f"KV layout gives {kv_caches.page_bytes} bytes per engine block but the engine declared "
                f"{self.kv_info.block_bytes}; the offload tiers were sized for another layout"
            )
        num_blocks = self.num_blocks_per_tier()[0]
        device = kv_caches.device
        try:
            host = HostBlockBuffer(num_blocks * self.block_size_factor, kv_caches.page_bytes, pin=device.type == "cuda",
                                   row_multiple=self.block_size_factor)
        except (MemoryError, RuntimeError) as exc:
            raise ConfigError(f"tiers[0].capacity: cannot allocate {num_blocks * self.offloaded_block_bytes} bytes of "
                              f"host memory ({type(exc).__name__}); lower the CPU tier's capacity") from None
        pool = make_stream_pool(self.config.transfer.backend, device, self.config.transfer.num_streams)
        host_fences = SlotFences()
        handler = DeviceHostHandler(kv_caches, host, self.block_size_factor, pool, host_fences)
        yield GPULoadStoreSpec, CPULoadStoreSpec, handler
        yield CPULoadStoreSpec, GPULoadStoreSpec, handler
        above: tuple[Medium, type[LoadStoreSpec], TierIO, SlotFences] | None = None
        for kind in self.tier_kinds():
            io, fences = kind.build_io(), SlotFences()
            upstream = {above[0]: (above[2], above[3])} if above is not None else {}
            tier = SecondaryTierHandler(kind.medium, io, kv_caches, host, self.block_size_factor,
                                        self.offloaded_block_bytes, host_fences, fences, upstream,
                                        store_latency_bound_s=kind.store_latency_bound_s())
            yield CPULoadStoreSpec, kind.spec_type, tier
            yield kind.spec_type, GPULoadStoreSpec, tier
            if above is not None:
                yield above[1], kind.spec_type, tier
            above = (kind.medium, kind.spec_type, io, fences)
