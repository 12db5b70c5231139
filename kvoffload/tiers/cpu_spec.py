"""CPUOffloadingSpec: a CPU DRAM tier, optionally a local disk tier behind it, optionally the
reuse filter in front of both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvoffload.errors import ConfigError
from kvoffload.offload.abstract import LoadStoreSpec, OffloadingManager
from kvoffload.offload.cpu_manager import CPUOffloadingManager
from kvoffload.offload.disk_format import DiskLayout
from kvoffload.offload.mediums import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager
from kvoffload.offload.spec import OffloadingSpec


class CPUOffloadingSpec(OffloadingSpec):
    def num_blocks_per_tier(self) -> list[int]:
        """A tier's ``capacity`` is its total over all ranks (like vLLM's ``cpu_bytes_to_use``):
        under tensor parallelism each rank holds its shard of every block, capacity / world_size."""
        return self.config.tier_blocks(self.offloaded_block_bytes * self.kv_info.world_size)

    def disk_layout(self) -> DiskLayout | None:
        if len(self.config.tiers) < 2:
            return None
        return DiskLayout(
            digest=self.kv_info.layout_digest or "unnamed",
            block_bytes=self.offloaded_block_bytes,
            block_tokens=self.offloaded_block_size,
            num_slots=self.num_blocks_per_tier()[1],
            world_size=self.kv_info.world_size,
        )

    def get_manager(self) -> OffloadingManager:
        try:
            return self._build_manager()
        except MemoryError:
            blocks = self.num_blocks_per_tier()
            raise ConfigError(f"tiers: {max(blocks)} blocks per tier are too many to track in this process's memory; "
                              "lower the capacity or raise offloaded_block_size") from None

    def _build_manager(self) -> OffloadingManager:
        cfg = self.config
        cpu_tier = cfg.tiers[0]
        manager: OffloadingManager = CPUOffloadingManager(
            self.num_blocks_per_tier()[0],
            cache_policy=cpu_tier.eviction_policy,
            enable_events=cfg.metrics.events,
            block_size=self.offloaded_block_size,
        )
        layout = self.disk_layout()
        if layout is not None:
            from kvoffload.offload.disk_manager import DiskOffloadingManager
            from kvoffload.offload.tiered_manager import TieredOffloadingManager

            disk_tier = cfg.tiers[1]
            assert disk_tier.path is not None
            disk = DiskOffloadingManager(disk_tier.path, layout, disk_tier.eviction_policy, cfg.metrics.events)
            manager = TieredOffloadingManager(manager, disk, disk_tier.write_through)  # type: ignore[arg-type]
        if cfg.store_threshold >= 2:
            manager = FilterReusedOffloadingManager(manager, cfg.store_threshold, cfg.max_tracker_size)
        return manager

    def get_handlers(self, kv_caches: Any) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], Any]]:
        """Device <-> host handlers (and disk ones) over a CanonicalKVCache; imports torch."""
        from kvoffload.transfer.device_host_handler import DeviceHostHandler
        from kvoffload.transfer.host_buffer import HostBlockBuffer
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
        fences = SlotFences()
        handler = DeviceHostHandler(kv_caches, host, self.block_size_factor, pool, fences)
        yield GPULoadStoreSpec, CPULoadStoreSpec, handler
        yield CPULoadStoreSpec, GPULoadStoreSpec, handler
        layout = self.disk_layout()
        if layout is not None:
            from kvoffload.offload.disk_manager import prepare_tier_dir, tier_file
            from kvoffload.transfer.disk_handler import DiskHandler

            disk_path = self.config.tiers[1].path
            assert disk_path is not None
            layout = layout.for_rank(self.kv_info.rank)  # each rank reads and writes only its own file
            path = tier_file(prepare_tier_dir(disk_path), layout)
            disk = DiskHandler(kv_caches, host, self.block_size_factor, layout, path, fences)
            yield CPULoadStoreSpec, DiskLoadStoreSpec, disk
            yield DiskLoadStoreSpec, GPULoadStoreSpec, disk
