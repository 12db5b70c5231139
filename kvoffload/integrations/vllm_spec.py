"""KVOffloadSpec: kvoffload's tiers under vLLM's own ``OffloadingConnector``.

The lighter route for people who keep vLLM's connector and only swap the backend::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "KVOffloadSpec",
                                   "spec_module_path": "kvoffload.integrations.vllm_spec",
                                   "config": {"tiers": [{"medium": "cpu", "capacity": "8GiB"}]}}}

(with the plugin installed, ``spec_module_path`` may be left out). vLLM keeps its scheduler
logic, chunking (``block_size`` / ``blocks_per_chunk`` in the extra config) and job tracking;
kvoffload supplies the manager (its ledger, eviction policies incl. the research ones, the
reuse filter) and a transfer worker that runs on vLLM's CPU backend as well as on CUDA.

The disk tier is refused here: vLLM 0.32's OffloadingConnector assumes every transfer
succeeds, and a disk record that fails its checksum must be reported and recomputed.
``KVOffloadConnector`` (kvoffload's own connector) serves disk tiers with that handling.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingSpec, OffloadingWorker
from vllm.v1.kv_offload.config import OffloadingConfig

from kvoffload.config import ConfigError, OffloadConfig
from kvoffload.integrations.vllm import load_extra_config
from kvoffload.integrations.vllm_manager import KVOffloadManager
from kvoffload.offload.abstract import OffloadingManager as KVOffloadingManager
from kvoffload.offload.cpu_tier import CPUTier
from kvoffload.offload.empty_chain import EmptyTierChain
from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager

SPEC_NAME = "KVOffloadSpec"
#: Keys of vLLM's own CPUOffloadingSpec that mean something else here.
_VLLM_CPU_KEYS = ("cpu_bytes_to_use", "eviction_policy", "store_threshold", "max_tracker_size",
                  "cache_policy_module_path")


def check_config(cfg: OffloadConfig, extra: dict) -> None:
    misplaced = [k for k in _VLLM_CPU_KEYS if k in extra]
    if misplaced:
        raise ConfigError(
            f"kv_connector_extra_config.{misplaced[0]}: a key of vLLM's CPUOffloadingSpec; with {SPEC_NAME} put "
            "capacity, eviction_policy and store_threshold in the kvoffload config (\"config\" or \"config_file\")"
        )
    if len(cfg.tiers) != 1 or cfg.tiers[0].medium != "cpu":
        raise ConfigError(
            f"tiers: {SPEC_NAME} serves exactly one CPU tier, not {'+'.join(t.medium for t in cfg.tiers)} (vLLM's "
            "OffloadingConnector cannot report a failed read of a slower tier); for disk, fs or mooncake tiers use "
            "\"kv_connector\": \"KVOffloadConnector\""
        )
    if cfg.offloaded_block_size is not None:
        raise ConfigError(
            "offloaded_block_size: vLLM's OffloadingConnector chunks blocks itself; set \"block_size\" in "
            "kv_connector_extra_config instead"
        )


class KVOffloadSpec(OffloadingSpec):
    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        """The same ``vllm:kv_offload_*`` metrics as vLLM's CPU spec (KVOffloadManager.get_stats
        reports them), the skipped-store counter when our config enables the reuse filter."""
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec as VllmCPUSpec

        try:
            threshold = load_extra_config(dict(extra_config)).store_threshold
        except ConfigError:
            threshold = 0  # start-up reports the config error itself
        return VllmCPUSpec.build_metric_definitions({"store_threshold": threshold})

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        extra = dict(self.extra_config)
        self.offload_config = load_extra_config(extra)
        check_config(self.offload_config, extra)
        copies = max(1, config.parallel.world_size)
        #: Bytes of one offloaded chunk summed over workers (each worker keeps its own shard).
        self.chunk_bytes = config.worker_kv_bytes_per_block * self.blocks_per_chunk * copies
        tier = self.offload_config.tiers[0]
        self.num_chunks = tier.num_blocks(self.chunk_bytes, "tiers[0]") if self.chunk_bytes else 0
        self._manager: KVOffloadManager | None = None
        self._worker: OffloadingWorker | None = None

    def _build_manager(self) -> KVOffloadingManager:
        cfg = self.offload_config
        block_size = self.tokens_per_block[0] * self.blocks_per_chunk if self.tokens_per_block else 0
        if self.num_chunks == 0:  # no KV bytes on this worker: an empty cache, as vLLM's spec builds
            return EmptyTierChain(block_size)
        manager: KVOffloadingManager = CPUTier(
            self.num_chunks,
            cache_policy=cfg.tiers[0].cache_policy,
            enable_events=self.kv_events_config.enable_kv_cache_events or cfg.metrics.events,
            block_size=block_size,
        )
        if cfg.store_threshold >= 2:
            manager = FilterReusedOffloadingManager(manager, cfg.store_threshold, cfg.max_tracker_size)
        return manager

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = KVOffloadManager(self._build_manager, self.offload_config.hints)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            from kvoffload.integrations.vllm_worker import KVOffloadWorker

            transfer = self.offload_config.transfer
            self._worker = KVOffloadWorker(kv_caches, self.blocks_per_chunk, self.num_chunks, transfer.backend,
                                           transfer.num_streams)
        return self._worker
