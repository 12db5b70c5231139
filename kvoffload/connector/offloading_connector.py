"""OffloadingConnector: the facade the engine builds once per role.

The scheduler-role instance owns an ``OffloadingConnectorScheduler`` (planning, no tensors),
the worker-role instance an ``OffloadingConnectorWorker`` (copies, no policy). Both build the
same ``OffloadingSpec`` from the offload config, which is where tiers and policies plug in.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kvoffload.config import OffloadConfig
from kvoffload.connector.base import (
    AllocatedBlocks,
    EngineConfigView,
    EngineRequest,
    GroupBlockIds,
    KVConnectorBase,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
    ScheduledStep,
)
from kvoffload.connector.offloading_metadata import LoadReading, OffloadingConnectorMetadata, StepTiming
from kvoffload.connector.scheduler.offloading_scheduler import OffloadingConnectorScheduler
from kvoffload.kv_events import KVEvent
from kvoffload.kv_info import EngineKVInfo
from kvoffload.offload.spec import OffloadingSpecFactory
from kvoffload.transfer.result import TransferResult

if TYPE_CHECKING:
    import torch

    from kvoffload.connector.worker.offloading_worker import OffloadingConnectorWorker
    from kvoffload.transfer.layout import KVCaches

#: What a connector is built from: the engine's config (its ``kv_offload`` section is read) or
#: the offload config itself, in any form ``OffloadConfig.coerce`` takes.
ConnectorConfig = EngineConfigView | OffloadConfig | str | Path | Mapping[str, object]


class OffloadingConnector(KVConnectorBase):
    def __init__(self, config: ConnectorConfig, role: KVConnectorRole, kv_info: EngineKVInfo | None = None) -> None:
        super().__init__(config, role)
        if kv_info is None:
            raise ValueError("OffloadingConnector needs the engine's KV geometry (kv_info=EngineKVInfo(...))")
        raw = config if isinstance(config, (OffloadConfig, str, Path, Mapping)) else config.kv_offload
        self.offload_config = OffloadConfig.coerce(raw)
        self.spec = OffloadingSpecFactory.create_spec(self.offload_config, kv_info)
        self.connector_scheduler: OffloadingConnectorScheduler | None = None
        self.connector_worker: OffloadingConnectorWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = OffloadingConnectorScheduler(self.spec)
        else:  # imported here: the scheduler role (its own process in vLLM) never loads torch for it
            from kvoffload.connector.worker.offloading_worker import OffloadingConnectorWorker

            self.connector_worker = OffloadingConnectorWorker(self.spec)

    # ---- worker side ---------------------------------------------------------------------
    def _worker(self) -> OffloadingConnectorWorker:
        assert self.connector_worker is not None, "called a worker-side method on the scheduler-role connector"
        return self.connector_worker

    def _scheduler(self) -> OffloadingConnectorScheduler:
        assert self.connector_scheduler is not None, "called a scheduler-side method on the worker-role connector"
        return self.connector_scheduler

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        self._worker().register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.connector_worker is not None and isinstance(connector_metadata, OffloadingConnectorMetadata):
            self.connector_worker.begin_step(connector_metadata)

    def handle_preemptions(self, connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(connector_metadata, OffloadingConnectorMetadata)
        self._worker().handle_preemptions(connector_metadata)

    def start_load_kv(self, **kwargs: object) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, OffloadingConnectorMetadata)
        self._worker().start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker().wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, **kwargs: object) -> None:
        self._worker().save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        self._worker().wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker().get_finished(finished_req_ids)

    def get_failed_recving(self) -> set[str]:
        return self._worker().get_failed_recving()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker().take_failed_block_ids()

    def build_connector_worker_meta(self) -> list[TransferResult | StepTiming | LoadReading]:
        return self._worker().build_connector_worker_meta()

    # ---- scheduler side ------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: EngineRequest, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: EngineRequest, blocks: AllocatedBlocks, num_external_tokens: int) -> None:
        self._scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: ScheduledStep) -> KVConnectorMetadata:
        return self._scheduler().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        results = connector_output.worker_meta
        if results is not None:
            assert isinstance(results, list), "worker_meta is what build_connector_worker_meta returned"
            self._scheduler().update_connector_output(results)

    def request_finished(self, request: EngineRequest, block_ids: GroupBlockIds) -> tuple[bool, dict[str, object] | None]:
        return self._scheduler().request_finished(request, block_ids)

    def swap_out(self, request: EngineRequest, block_ids: GroupBlockIds) -> bool:
        return self._scheduler().swap_out(request, block_ids)

    def has_pending_work(self) -> bool:
        return self._scheduler().has_pending_work()

    def take_events(self) -> list[KVEvent]:
        return self._scheduler().take_events()

    def reset_cache(self) -> bool:
        return self._scheduler().reset_cache()

    # ---- lifecycle and reports -----------------------------------------------------------
    def stats(self) -> Mapping[str, object]:
        if self.connector_scheduler is not None:
            return self.connector_scheduler.stats_dict()
        return self._worker().stats_dict()

    def close(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.close()
        if self.connector_scheduler is not None:
            self.connector_scheduler.manager.close()
