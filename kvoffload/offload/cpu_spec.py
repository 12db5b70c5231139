"""CPUOffloadingSpec: a CPU DRAM tier, optionally behind the reuse filter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvoffload.config import ConfigError
from kvoffload.offload.abstract import LoadStoreSpec, OffloadingManager
from kvoffload.offload.cpu_manager import CPUOffloadingManager
from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager
from kvoffload.offload.spec import OffloadingSpec


class CPUOffloadingSpec(OffloadingSpec):
    def num_blocks_per_tier(self) -> list[int]:
        return self.config.tier_blocks(self.offloaded_block_bytes)

    def get_manager(self) -> OffloadingManager:
        cfg = self.config
        if len(cfg.tiers) > 1:
            raise ConfigError("tiers[1]: the disk tier is not available in this version; remove it")
        (num_blocks,) = self.num_blocks_per_tier()
        manager: OffloadingManager = CPUOffloadingManager(
            num_blocks,
            cache_policy=cfg.tiers[0].eviction_policy,
            enable_events=cfg.metrics.events,
            block_size=self.offloaded_block_size,
        )
        if cfg.store_threshold >= 2:
            manager = FilterReusedOffloadingManager(manager, cfg.store_threshold, cfg.max_tracker_size)
        return manager

    def get_handlers(self, kv_caches: Any) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], Any]]:
        """Device <-> host handlers over ``kv_caches`` (a CanonicalKVCache); imports torch."""
        from kvoffload.transfer.device_host_handler import DeviceHostHandler
        from kvoffload.transfer.host_buffer import HostBlockBuffer
        from kvoffload.transfer.streams import make_stream_pool

        (num_blocks, *_) = self.num_blocks_per_tier()
        device = kv_caches.device
        host = HostBlockBuffer(num_blocks * self.block_size_factor, kv_caches.page_bytes, pin=device.type == "cuda")
        pool = make_stream_pool(self.config.transfer.backend, device, self.config.transfer.num_streams)
        handler = DeviceHostHandler(kv_caches, host, self.block_size_factor, pool)
        yield GPULoadStoreSpec, CPULoadStoreSpec, handler
        yield CPULoadStoreSpec, GPULoadStoreSpec, handler
