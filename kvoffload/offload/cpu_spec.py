"""CPUOffloadingSpec: a CPU DRAM tier, optionally behind the reuse filter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvoffload.config import ConfigError
from kvoffload.offload.abstract import LoadStoreSpec, OffloadingManager
from kvoffload.offload.cpu_manager import CPUOffloadingManager
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
        raise NotImplementedError("worker-side handlers arrive with the transfer layer")
