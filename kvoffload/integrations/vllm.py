"""KVOffloadConnector: kvoffload's scheduler and worker halves inside a real vLLM.

Configure through ``kv_transfer_config``::

    {"kv_connector": "KVOffloadConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"config_file": "tiers.yaml"}}   # or {"config": {...}}

The ``vllm.general_plugins`` entry point registers the name with vLLM's connector factory;
``"kv_connector_module_path": "kvoffload.integrations.vllm"`` works without it. vLLM's request,
block and scheduler-output objects are passed through (our halves only read the attributes the
two engines share); the few differences (resumed requests, worker metadata) are bridged here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

from kvoffload.config import ConfigError, OffloadConfig, format_bytes, weight_digest_dir
from kvoffload.connector.scheduler.offloading_scheduler import OffloadingConnectorScheduler
from kvoffload.connector.worker.offloading_worker import OffloadingConnectorWorker
from kvoffload.examples import resolve_config
from kvoffload.integrations.vllm_events import vllm_block_hash, vllm_events, vllm_request_tags
from kvoffload.integrations.vllm_lora import AdapterSalt
from kvoffload.integrations.vllm_namespace import vllm_namespace
from kvoffload.integrations.vllm_stats import (
    DeltaTracker,
    KVOffloadConnectorStats,
    KVOffloadPromMetrics,
    scheduler_totals,
    worker_totals,
)
from kvoffload.kv_info import EngineKVInfo
from kvoffload.metrics import gauge_values
from kvoffload.offload.spec import OffloadingSpecFactory
from kvoffload.yaml_input import load_yaml

CONNECTOR_NAME = "KVOffloadConnector"
# Under "vllm." so vLLM's logging config (level, format) applies to our start-up lines too.
logger = logging.getLogger("vllm.kvoffload")


@dataclass
class _WorkerResults(KVConnectorWorkerMetadata):
    """Finished-copy results of one step, summed over workers."""

    results: list = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, _WorkerResults)
        return _WorkerResults(self.results + other.results)


@dataclass
class _Meta(KVConnectorMetadata):
    inner: Any = None


@dataclass
class _CachedView:
    req_ids: list[str]
    resumed_from_preemption: list[bool]
    new_block_ids: list


@dataclass
class _OutputView:
    """vLLM's SchedulerOutput, in the shape our scheduler half reads."""

    scheduled_new_reqs: list
    scheduled_cached_reqs: _CachedView
    num_scheduled_tokens: dict[str, int]
    preempted_req_ids: set[str]
    #: vLLM shares no blocks between requests (no copy-on-write): never any.
    block_replacements: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)


def load_extra_config(extra: dict[str, Any]) -> OffloadConfig:
    """Our config from ``kv_connector_extra_config``: ``config_file`` (YAML, or a packaged
    example's name) and/or inline
    ``config``; with both, the inline top-level keys replace the file's."""
    raw = extra.get("config") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"kv_connector_extra_config.config: {raw!r} must be a dict (the YAML schema inline)")
    path = extra.get("config_file")
    if path is not None and not isinstance(path, str):
        raise ConfigError(f"kv_connector_extra_config.config_file: {path!r} must be the path of a YAML file (a string)")
    if not path and not raw:
        raise ConfigError('kv_connector_extra_config needs "config_file" (a YAML path) or "config" (a dict)')
    if not path:
        return OffloadConfig.from_dict(raw)
    path = resolve_config(path)  # a packaged example by name ("vllm_tiers") works from any directory
    base = OffloadConfig.from_yaml(path)  # validates the file on its own, errors name the file
    if not raw:
        return base
    merged = dict(load_yaml(Path(path).read_text(), str(path)[:200]) or {})
    merged.update(raw)
    return OffloadConfig.from_dict(merged)


def _splits_seeded_prefills(vllm_config: Any) -> bool:
    """vLLM's CPU build with chunked prefill on: where a seeded request's split prefill is fatal."""
    return (vllm_config.device_config.device_type == "cpu"
            and bool(vllm_config.scheduler_config.enable_chunked_prefill))


def _kv_info(vllm_config: Any, kv_cache_config: Any, role: KVConnectorRole) -> EngineKVInfo:
    """KV geometry of one rank. Under tensor/pipeline parallelism every rank holds its own
    shard of each block: the scheduler side plans for all of them (``world_size``), each worker
    side copies its own (``rank``), and tier capacities are totals over the ranks."""
    groups = kv_cache_config.kv_cache_groups
    spec = groups[0].kv_cache_spec
    num_layers = sum(len(g.layer_names) for g in groups)
    windows = tuple(_group_window(g.kv_cache_spec) for g in groups)
    if len({g.kv_cache_spec.block_size for g in groups}) > 1:
        raise ValueError("kvoffload: KV-cache groups with different block sizes "
                         f"({sorted({g.kv_cache_spec.block_size for g in groups})}) are not supported; "
                         "serve this model without a kvoffload connector")
    # Hybrid (vLLM's hybrid allocator): groups of equal layer count overlay the same KV tensors
    # (a block id belongs to one group), so a block is one page per layer of a group.
    block_bytes = spec.page_size_bytes * max(len(g.layer_names) for g in groups)
    parallel = vllm_config.parallel_config
    world_size = parallel.tensor_parallel_size * parallel.pipeline_parallel_size
    rank = 0
    if role == KVConnectorRole.WORKER and world_size > 1:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        rank = get_tensor_model_parallel_rank() + get_pp_group().rank_in_group * parallel.tensor_parallel_size
    namespace = vllm_namespace(vllm_config, spec, num_layers)
    return EngineKVInfo(block_size=spec.block_size, block_bytes=block_bytes,
                        num_device_blocks=kv_cache_config.num_blocks, layout_digest=namespace.digest,
                        world_size=world_size, rank=rank, namespace=namespace, group_windows=windows)


def _group_window(spec: Any) -> int | None:
    """A KV-cache group's sliding window (None: full attention); other kinds are refused by name."""
    kind = type(spec).__name__
    if kind == "SlidingWindowSpec" and not getattr(spec, "extra_retained_tokens", 0):
        return int(spec.sliding_window)
    if kind == "FullAttentionSpec":
        return None
    raise ValueError(f"kvoffload: KV-cache group of kind {kind} is not supported (full attention and sliding "
                     "windows are); serve this model without a kvoffload connector")


class KVOffloadConnector(KVConnectorBase_V1, SupportsHMA):
    """kvoffload's connector inside vLLM. ``SupportsHMA``: vLLM keeps its hybrid allocator on,
    so a sliding-window group keeps (and offloads, and loads) one window, not the whole context."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.offload_config = load_extra_config(extra)
        events = getattr(vllm_config, "kv_events_config", None)
        if events is not None and events.enable_kv_cache_events and not self.offload_config.metrics.events:
            # vLLM publishes KV events: the tiers must record them.
            self.offload_config = dataclasses.replace(
                self.offload_config, metrics=dataclasses.replace(self.offload_config.metrics, events=True))
        self._deltas = DeltaTracker()
        policy = getattr(vllm_config.kv_transfer_config, "kv_load_failure_policy", "recompute")
        if role == KVConnectorRole.SCHEDULER and policy != "recompute":
            logger.warning("kvoffload: kv_load_failure_policy=%r: a block that fails to load (checksum, I/O error) "
                           "fails its request; set kv_load_failure_policy='recompute' to recompute it instead", policy)
        if role == KVConnectorRole.SCHEDULER and policy == "recompute" and _splits_seeded_prefills(vllm_config):
            logger.warning("kvoffload: vLLM's CPU build with chunked prefill: a request with its own seed whose "
                           "prefill spans several steps kills the engine (vLLM 0.32: 'CPU Generator does not use "
                           "offset', with or without a connector), and a failed load under recompute turns a "
                           "one-token prefill into a whole one, which a busy step splits; serve seeded requests "
                           "with --no-enable-chunked-prefill and --max-num-batched-tokens >= --max-model-len")
        if role == KVConnectorRole.SCHEDULER:
            for tier in self.offload_config.tiers:
                if tier.capacity_share is not None:  # sized here, from the free space: say how large
                    logger.info("kvoffload: %s tier at %s: capacity %s (%g%% of the free space there)", tier.name,
                                tier.path, format_bytes(tier.capacity_bytes), 100 * tier.capacity_share)
        spec = OffloadingSpecFactory.create_spec(self.offload_config, _kv_info(vllm_config, kv_cache_config, role))
        self.sched: OffloadingConnectorScheduler | None = None
        self.worker: OffloadingConnectorWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            # A load given up (slower than recomputing) is a failed load to vLLM: only where that
            # recomputes, never where it would fail the request.
            self.sched = OffloadingConnectorScheduler(spec, AdapterSalt(weight_digest_dir()), vllm_request_tags,
                                                      vllm_block_hash, give_up_loads=policy == "recompute")
        else:
            self.worker = OffloadingConnectorWorker(spec)
            self.worker.load_blocks.collect = True

    # ---- worker side -------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self.worker is not None
        self.worker.register_kv_caches(kv_caches)
        first = next(iter(kv_caches.values()))
        views = self.worker.kv.views if self.worker.kv is not None else ()
        logger.info("kvoffload: %d KV tensors like %s %s -> %d block views, %d bytes per block",
                    len(kv_caches), tuple(first.shape), first.dtype, len(views),
                    sum(v.shape[1] for v in views))

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.worker is not None and isinstance(connector_metadata, _Meta):
            self.worker.begin_step(connector_metadata.inner)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self.worker is not None and isinstance(kv_connector_metadata, _Meta):
            self.worker.handle_preemptions(kv_connector_metadata.inner)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert self.worker is not None and isinstance(meta, _Meta)
        self.worker.start_load_kv(meta.inner)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.worker is not None:
            self.worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        if self.worker is not None:
            self.worker.save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        if self.worker is not None:
            self.worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """A request whose load failed is reported as received too (vLLM's contract), with its
        blocks in ``get_block_ids_with_load_errors`` in the same pass: vLLM recomputes them."""
        assert self.worker is not None
        sent, recved = self.worker.get_finished(finished_req_ids)
        return sent, recved | self.worker.get_failed_recving()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_failed_block_ids() if self.worker is not None else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self.worker is None:
            return None
        results = self.worker.build_connector_worker_meta()
        return _WorkerResults(results) if results else None

    # ---- stats and events --------------------------------------------------------------
    def get_kv_connector_stats(self) -> KVOffloadConnectorStats | None:
        """Increments since the last call: the scheduler half's lookups, hits and stores, a
        worker half's copies (vLLM sums the halves and the workers)."""
        data: dict[str, Any]
        if self.sched is not None:
            stats = self.sched.stats_dict()
            data = {"c": self._deltas.delta(scheduler_totals(stats)), "g": gauge_values(stats), "s": {}}
        elif self.worker is not None and self.worker.worker is not None:
            samples: dict[str, list[list[float]]] = {}
            for direction, seconds, nbytes in self.worker.stats.take_recent():
                samples.setdefault(direction, []).append([seconds, nbytes])
            data = {"c": self._deltas.delta(worker_totals(self.worker.stats_dict())), "g": {}, "s": samples}
        else:
            return None
        stats_out = KVOffloadConnectorStats(data=data)
        return None if stats_out.is_empty() else stats_out

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVOffloadConnectorStats:
        return KVOffloadConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict[type, type], labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> KVOffloadPromMetrics:
        return KVOffloadPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def take_events(self) -> Iterable[Any]:
        if self.sched is None:
            return ()
        return list(vllm_events(self.sched.take_events()))

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.sched is not None:
            self.sched.manager.close()

    # ---- scheduler side ----------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.sched is not None
        return self.sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self.sched is not None
        self.sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self.sched is not None
        cached = scheduler_output.scheduled_cached_reqs
        resumed: set[str] = getattr(cached, "resumed_req_ids", set()) or set()
        view = _OutputView(
            scheduled_new_reqs=list(scheduler_output.scheduled_new_reqs),
            scheduled_cached_reqs=_CachedView(list(cached.req_ids), [r in resumed for r in cached.req_ids],
                                              list(cached.new_block_ids)),
            num_scheduled_tokens=dict(scheduler_output.num_scheduled_tokens),
            preempted_req_ids=set(getattr(scheduler_output, "preempted_req_ids", None) or ()),
        )
        return _Meta(self.sched.build_connector_meta(view))

    def update_connector_output(self, connector_output: Any) -> None:
        assert self.sched is not None
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        self.sched.update_connector_output(meta.results if isinstance(meta, _WorkerResults) else [])

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        """vLLM without its hybrid allocator: one group's block ids."""
        assert self.sched is not None
        return self.sched.request_finished(request, (list(block_ids),))

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        assert self.sched is not None
        return self.sched.request_finished(request, block_ids)

    def reset_cache(self) -> bool | None:
        """vLLM calls this for ``reset_prefix_cache(reset_connector=True)`` (what
        ``pause_generation(clear_cache=True)`` does after a weight update) and for
        ``POST /reset_prefix_cache?reset_external=true``."""
        return self.sched.reset_cache() if self.sched is not None else None

    def has_pending_push_work(self) -> bool:
        """Keep vLLM's engine stepping until queued copies (disk demotions) have run."""
        return self.sched is not None and self.sched.has_pending_work()


def register() -> None:
    """``vllm.general_plugins`` hook: make "KVOffloadConnector" a known connector name and
    "KVOffloadSpec" a known spec of vLLM's own OffloadingConnector."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory as VllmSpecFactory

    # Plugins load once per process, but a second call must not fail start-up.
    with contextlib.suppress(ValueError):
        KVConnectorFactory.register_connector(CONNECTOR_NAME, __name__, "KVOffloadConnector")
    with contextlib.suppress(ValueError):
        VllmSpecFactory.register_spec("KVOffloadSpec", "kvoffload.integrations.vllm_spec", "KVOffloadSpec")
