"""OffloadingConnector: the facade the engine builds once per role.

The scheduler-role instance owns an ``OffloadingConnectorScheduler`` (planning, no tensors),
the worker-role instance an ``OffloadingConnectorWorker`` (copies, no policy). Both build the
same ``OffloadingSpec`` from the offload config, which is where tiers and policies plug in.
"""

from __future__ import annotations

from typing import Any

from kvoffload.config import OffloadConfig
from kvoffload.connector.base import KVConnectorBase, KVConnectorMetadata, KVConnectorRole
from kvoffload.connector.offloading_metadata import OffloadingConnectorMetadata
from kvoffload.connector.offloading_scheduler import OffloadingConnectorScheduler
from kvoffload.connector.offloading_worker import OffloadingConnectorWorker
from kvoffload.kv_info import EngineKVInfo
from kvoffload.offload.spec import OffloadingSpecFactory


class OffloadingConnector(KVConnectorBase):
    def __init__(self, config: Any, role: KVConnectorRole, kv_info: EngineKVInfo | None = None) -> None:
        super().__init__(config, role)
        if kv_info is None:
            raise ValueError("OffloadingConnector needs the engine's KV geometry (kv_info=EngineKVInfo(...))")
        raw = getattr(config, "kv_offload", config)
        self.offload_config = OffloadConfig.coerce(raw)
        self.spec = OffloadingSpecFactory.create_spec(self.offload_config, kv_info)
        self.connector_scheduler: OffloadingConnectorScheduler | None = None
        self.connector_worker: OffloadingConnectorWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = OffloadingConnectorScheduler(self.spec)
        else:
            self.connector_worker = OffloadingConnectorWorker(self.spec)

    # ---- worker side ---------------------------------------------------------------------
    def _worker(self) -> OffloadingConnectorWorker:
        assert self.connector_worker is not None, "called a worker-side method on the scheduler-role connector"
        return self.connector_worker

    def _scheduler(self) -> OffloadingConnectorScheduler:
        assert self.connector_scheduler is not None, "called a scheduler-side method on the worker-role connector"
        return self.connector_scheduler

    def register_kv_caches(self, kv_caches: Any) -> None:
        self._worker().register_kv_caches(kv_caches)

    def handle_preemptions(self, connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(connector_metadata, OffloadingConnectorMetadata)
        self._worker().handle_preemptions(connector_metadata)

    def start_load_kv(self, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, OffloadingConnectorMetadata)
        self._worker().start_load_kv(meta)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker().get_finished(finished_req_ids)

    def get_failed_recving(self) -> set[str]:
        return self._worker().get_failed_recving()

    def build_connector_worker_meta(self) -> Any:
        return self._worker().build_connector_worker_meta()

    # ---- scheduler side ------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return self._scheduler().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._scheduler().update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler().request_finished(request, block_ids)

    def swap_out(self, request: Any, block_ids: Any) -> bool:
        return self._scheduler().swap_out(request, block_ids)

    def has_pending_work(self) -> bool:
        return self._scheduler().has_pending_work()

    def take_events(self) -> Any:
        return self._scheduler().take_events()

    def reset_cache(self) -> bool:
        return self._scheduler().reset_cache()

    # ---- lifecycle and reports -----------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        if self.connector_scheduler is not None:
            return self.connector_scheduler.stats_dict()
        return self._worker().stats_dict()

    def close(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.close()
        if self.connector_scheduler is not None:
            self.connector_scheduler.manager.close()
