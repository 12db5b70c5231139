"""Admission: whether the request at the head of the waiting queue starts this step, and how.

Its hits (the device's prefix cache, then the connector's), its blocks (with a load's, and the
watermark kept for running requests), and its load: synchronous (it runs now), asynchronous (it
waits for the load to land, holding its blocks), failed (it recomputes). The queue walk, the
budget and preemption stay the scheduler's.
"""

from __future__ import annotations

from collections.abc import Callable

from kvoffload.connector.base import KVConnectorBase
from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.remote_loads import LoadOutcome, PendingLoad, RemoteLoads
from kvoffload.engine.request import Request, RequestStatus
from kvoffload.engine.scheduler_stats import SchedulerStats
from kvoffload.engine.step_draft import QueuePass, StepDraft, Verdict


class Admission:
    def __init__(self, kv_cache_manager: KVCacheManager, connector: KVConnectorBase | None, remote_loads: RemoteLoads,
                 stats: SchedulerStats, running: list[Request], max_num_seqs: int, enable_chunked_prefill: bool,
                 watermark_blocks: int, clamp: Callable[[Request, int, int], int]) -> None:
        """``running``: the scheduler's running list (an admitted request joins it); ``clamp``:
        the scheduler's cap on a request's tokens in one step."""
        self.kv_cache_manager = kv_cache_manager
        self.connector = connector
        self.remote_loads = remote_loads
        self.stats = stats
        self.running = running
        self.max_num_seqs = max_num_seqs
        self.enable_chunked_prefill = enable_chunked_prefill
        self.watermark_blocks = watermark_blocks
        self._clamp = clamp

    def try_admit(self, request: Request, step: StepDraft, adm: QueuePass) -> Verdict:
        """Admit the head of the waiting queue (the caller pops it) or say why not."""
        if adm.landed_left >= 0 and not self.remote_loads.landed(request):
            return Verdict.SKIP
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            if not self._load_reported(request):
                return Verdict.SKIP
            adm.num_loading -= 1
            if adm.landed_left >= 0:
                adm.landed_left -= 1
                if request.num_computed_tokens == 0:  # its load failed: it queues anew
                    return Verdict.SKIP if adm.landed_left else Verdict.SKIP_AND_STOP
        elif len(self.running) + adm.num_loading >= self.max_num_seqs:
            return Verdict.BLOCKED
        load_async = False
        num_external = 0
        if request.num_computed_tokens == 0:
            computed_blocks, num_local = self.kv_cache_manager.get_computed_blocks(request)
            if self.connector is not None:
                matched, load_async = self.connector.get_num_new_matched_tokens(request, num_local)
                if matched is None:
                    return Verdict.SKIP
                num_external = matched
            num_computed = num_local + num_external
        else:
            computed_blocks, num_local = self.kv_cache_manager.empty_blocks(), 0
            num_computed = request.num_computed_tokens
        num_new = 0
        if not load_async:
            num_new = request.num_tokens - num_computed
            if not self.enable_chunked_prefill and num_new > step.budget:
                return Verdict.BLOCKED
            num_new = self._clamp(request, num_new, step.budget)
            assert num_new > 0, f"request {request.request_id} has nothing left to compute"
        # An async load also reserves its prompt's remaining blocks, so a request whose load
        # landed never waits for room while holding blocks (no hold-and-wait).
        new_blocks = self.kv_cache_manager.allocate_slots(
            request,
            num_new,
            num_local,
            computed_blocks,
            num_lookahead_tokens=request.num_tokens - num_computed if load_async else 0,
            num_external_computed_tokens=num_external,
            delay_cache_blocks=load_async,
            reserve_blocks=self.watermark_blocks if self.running else 0,
        )
        if new_blocks is None:
            if not self.running and not len(self.remote_loads) and self.kv_cache_manager.block_pool.is_empty():
                raise RuntimeError(
                    f"request {request.request_id}: {num_new} tokens of a step need more device blocks than the "
                    f"whole cache has ({self.kv_cache_manager.block_pool.num_blocks - 1}, "
                    f"{self.kv_cache_manager.num_groups} KV-cache group(s)); raise num_gpu_blocks or lower "
                    f"max_num_batched_tokens")
            return Verdict.BLOCKED
        if self.connector is not None:
            self.connector.update_state_after_alloc(request, computed_blocks + new_blocks, num_external)
        if load_async:  # hits count once the load lands (a failed one serves nothing)
            self.remote_loads.start(request.request_id, PendingLoad(num_computed, num_local, num_external))
            adm.num_loading += 1
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            return Verdict.LOADING
        self.stats.device_hit_tokens += num_local
        self.stats.external_hit_tokens += num_external
        self.running.append(request)
        (step.resumed if request.status == RequestStatus.PREEMPTED else step.new).append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed
        if request.num_cached_tokens < 0:  # first admission: what its prompt found cached
            request.num_cached_tokens = num_computed
            self.stats.prompt_hit_tokens += num_computed
        step.schedule(request, new_blocks, num_new)
        return Verdict.ADMITTED

    def _load_reported(self, request: Request) -> bool:
        """A request whose external load was reported becomes schedulable again."""
        outcome, load = self.remote_loads.take(request.request_id)
        if outcome is LoadOutcome.IN_FLIGHT:
            return False
        if outcome is LoadOutcome.FAILED:
            # Recompute everything the load should have delivered: keep only local hits.
            self.stats.failed_loads += 1
            self.stats.failed_external_hit_tokens += load.external_hit_tokens
            self.kv_cache_manager.free(request)
            request.num_computed_tokens = 0
            request.status = RequestStatus.WAITING
            return True
        self.stats.device_hit_tokens += load.local_hit_tokens
        self.stats.external_hit_tokens += load.external_hit_tokens
        num_computed = min(load.computed_tokens, request.num_tokens - 1)
        self.kv_cache_manager.cache_blocks(request, num_computed)
        request.num_computed_tokens = num_computed
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        return True
