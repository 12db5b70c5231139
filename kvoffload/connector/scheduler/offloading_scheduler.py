"""Scheduler half of the OffloadingConnector: plans loads and stores; never touches a tensor.

Offloaded blocks may span ``block_size_factor`` engine blocks; offloaded block i is keyed by
the chained hash of its last engine block (which covers the whole prefix up to it). This class
answers the engine's calls and keeps the request and job records (``SchedulerRecords``); the plans
are the planners': loads (``LoadPlanner``), stores (``StorePlanner``), swap-mode preemption
(``SwapPlanner``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace

from kvoffload.connector.base import AllocatedBlocks, EngineRequest, GroupBlockIds, RequestSalt, ScheduledStep
from kvoffload.connector.cost.load_cost import LoadCostModel
from kvoffload.connector.group_keys import GroupGeometry
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.connector.offloading_metadata import LoadReading, OffloadingConnectorMetadata, StepTiming
from kvoffload.connector.scheduler.hint_relay import HintRelay
from kvoffload.connector.scheduler.kv_event_translator import ExternalHash, KVEventTranslator, RequestTags
from kvoffload.connector.scheduler.load_planner import LoadPlanner
from kvoffload.connector.scheduler.request_state import JobRecord
from kvoffload.connector.scheduler.reset_guard import ResetGuard
from kvoffload.connector.scheduler.scheduler_records import SchedulerRecords
from kvoffload.connector.scheduler.scheduler_stats import ConnectorStatsDict, SchedulerSideStats, connector_stats
from kvoffload.connector.scheduler.store_planner import StorePlanner
from kvoffload.connector.scheduler.swap_planner import SwapPlanner
from kvoffload.kv_events import KVEvent
from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.chain import TierChain
from kvoffload.offload.host_tier_chain import as_chain
from kvoffload.offload.spec import OffloadingSpec
from kvoffload.transfer.result import TransferResult

logger = logging.getLogger(__name__)

__all__ = ["ConnectorStatsDict", "OffloadingConnectorScheduler", "SchedulerSideStats"]


def _merge(parts: list[TransferResult]) -> TransferResult:
    """One result for a job every rank ran: success only if all succeeded."""
    first = parts[0]
    bad = tuple(sorted({b for p in parts for b in p.bad_block_ids}))
    rejected: dict[str, int] = {}
    for p in parts:  # ranks reject their shards of the same blocks: count each block once
        for reason, n in p.rejected:
            rejected[reason] = max(rejected.get(reason, 0), n)
    return replace(first, success=all(p.success for p in parts), nbytes=sum(p.nbytes for p in parts),
                   seconds=max(p.seconds for p in parts), bad_block_ids=bad, io_error=any(p.io_error for p in parts),
                   rejected=tuple(sorted(rejected.items())), skipped=any(p.skipped for p in parts),
                   cancelled=any(p.cancelled for p in parts))


class OffloadingConnectorScheduler:
    def __init__(self, spec: OffloadingSpec, request_salt: RequestSalt | None = None,
                 request_tags: RequestTags | None = None, external_hash: ExternalHash | None = None,
                 give_up_loads: bool = True) -> None:
        """``give_up_loads``: the engine recomputes a failed load (a load given up as slower than
        recomputing is one); False where it would fail the request instead."""
        self.spec = spec
        self.manager: TierChain = as_chain(spec.get_manager())
        self.block_size = spec.kv_info.block_size
        self.offloaded_block_size = spec.offloaded_block_size
        self.factor = spec.block_size_factor
        self.world_size = spec.kv_info.world_size
        self.groups = GroupGeometry(spec.kv_info.group_windows, self.block_size, self.factor)
        self.stats = SchedulerSideStats()
        events = KVEventTranslator(spec.config.metrics.events, self.block_size, self.factor, request_tags,
                                   external_hash)
        self.records = SchedulerRecords(self.block_size, self.factor, request_salt, events)
        #: After a reset: which device blocks were filled since (a request hitting others stores nothing).
        self.reset_guard = ResetGuard()
        shared = (self.records, self.manager, self.groups, self.stats, self.reset_guard)
        #: Per tier load timings and the engine's forward timings: how much of each hit to load.
        self.cost = LoadCostModel(spec.config.tier_load_modes(), self.offloaded_block_size,
                                  spec.offloaded_block_bytes * self.world_size, give_up=give_up_loads)
        #: Requests' hints (session, expected return, priority, lease), given to the policies.
        self.hints = HintRelay(self.manager, spec.config.hints, self.stats, request_salt=request_salt)
        self.loads = LoadPlanner(*shared, self.cost, self.hints)
        self.stores = StorePlanner(*shared)
        self.swaps = SwapPlanner(*shared)
        #: A preempted request's swap-out (the engine asks the facade): the swap planner's own.
        self.swap_out = self.swaps.swap_out
        #: Results of jobs some ranks have reported and others not yet.
        self._partial: dict[int, list[TransferResult]] = {}

    def reset_cache(self) -> bool:
        """Forget every offloaded block, in every tier, for this engine (the model's weights
        changed in place). Offload keys get a fresh random salt: nothing stored before is ever
        found again, a restarted engine never finds what is stored after (its keys are unsalted),
        and a shared tier's other replicas keep their blocks. Requests already tracked store
        nothing more (their KV was computed before the reset); copies in flight finish under the
        old keys, which nobody looks up again. Old blocks leave the tiers by eviction. The
        engine's own device reset may fail (requests hold blocks) without the connector being
        told: ``ResetGuard`` keeps blocks computed from device KV older than the reset out of
        the tiers either way."""
        self.records.key_salt = os.urandom(16)
        for state in self.records.requests.values():
            state.swapped = None
        self.reset_guard.reset(self.records.requests.values())
        self._absorb_events()  # what happened before the reset, under the old keys
        self.records.events.reset()
        self.stats.resets += 1
        logger.info("kvoffload: offload cache reset (reset %d): blocks stored before it are never served again",
                    self.stats.resets)
        return True

    # ---- lookups and loads -----------------------------------------------------------------
    def _finished_keys(self, request: EngineRequest) -> list[list[BlockHash]]:
        """Per KV-cache group, a finished request's keys a hit would need: its prompt's (stored
        before, or now) and its output's whose KV was computed (the last sampled token never ran)."""
        tokens = max(request.num_tokens - len(request.output_token_ids), request.num_computed_tokens)
        return self.groups.useful_keys(self.records.offload_hashes(request, 0, tokens // self.offloaded_block_size))

    def get_num_new_matched_tokens(self, request: EngineRequest, num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self.records.state(request.request_id)
        if state.swapped is not None:
            restorable = self.swaps.restorable(request, num_computed_tokens)
            if restorable:
                return restorable, True
            state.swapped = None  # evicted meanwhile: the plain path decides
        state.local_tokens = num_computed_tokens
        return self.loads.hit_tokens(request, state, num_computed_tokens)

    def update_state_after_alloc(self, request: EngineRequest, blocks: AllocatedBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        state = self.records.state(rid)
        state.request = request
        state.block_ids = [list(ids) for ids in blocks.get_block_ids()]
        local, state.local_tokens = state.local_tokens, None
        # Local prefix hits: what the lookup was told, else (an engine that skipped the lookup:
        # one full-attention group) the blocks that already carry a hash.
        num_local = local if local is not None else sum(
            1 for b in blocks.blocks[0] if b.block_hash is not None) * self.block_size
        self.reset_guard.admit(state, state.block_ids, num_local // self.block_size)
        if num_external_tokens == 0:
            return
        if state.swapped is not None:
            self.swaps.plan_swap_in(request, state, num_local, num_external_tokens)
        else:
            self.loads.plan(request, state, num_local, num_external_tokens)

    # ---- each step ---------------------------------------------------------------------------
    def has_pending_work(self) -> bool:
        """Jobs in flight, demotions the manager queued that no step has planned yet, or finished
        requests whose blocks the next step's report releases (their copies ended before it)."""
        return bool(self.records.jobs) or self.manager.has_pending_demotions() or bool(self.records.next_step.await_finish)

    def _plan_demotions(self) -> list[TransferJob]:
        return [self.records.new_job(JobKind.DEMOTE, None, d.block_hashes, d.src, d.dst)
                for d in self.manager.take_demotions()]

    def build_connector_meta(self, scheduler_output: ScheduledStep) -> OffloadingConnectorMetadata:
        records = self.records
        allocated = self.stores.follow_blocks(scheduler_output)
        # Stores still reading a block the engine handed out again must land before it is written.
        fenced = records.fenced
        flush = {j for b in allocated if b in fenced for j in fenced[b]} if fenced else set()
        self.stats.store_flushes += len(flush)
        reqs_to_store = self.stores.plan(scheduler_output)
        step = records.take_next_step()
        meta = OffloadingConnectorMetadata(
            flush_jobs=flush,
            reqs_to_load=step.reqs_to_load,
            sync_loads=step.sync_loads,
            reqs_to_store=reqs_to_store,
            preempted_req_ids=set(scheduler_output.preempted_req_ids),
            demotions=self._plan_demotions(),
            swap_out=step.swap_out,
            await_finish=step.await_finish,
            num_step_tokens=sum(scheduler_output.num_scheduled_tokens.values()),
        )
        meta.cancel_loads = set(self.cost.overdue())
        self.cost.end_step(len(scheduler_output.num_scheduled_tokens), meta.num_step_tokens, len(step.reqs_to_load))
        return meta

    # ---- completions -------------------------------------------------------------------------
    def update_connector_output(self, results: Sequence[TransferResult | StepTiming | LoadReading]) -> None:
        """Digest the worker halves' results (every rank's, in any order)."""
        for result in results:
            if isinstance(result, StepTiming):
                self.cost.observe_step(result.tokens, result.seconds, result.sync_blocks, result.sync_wait_s,
                                       result.load_requests, result.load_host_s)
                continue
            if isinstance(result, LoadReading):
                record = self.records.jobs.get(result.job_id)
                if record is not None:
                    self.cost.load_reading(record.medium, result.job_id, result.seconds, result.done, result.piece,
                                           result.piece_s)
                continue
            job_id = result.job_id
            if job_id not in self.records.jobs:
                continue
            if self.world_size > 1:
                # Every rank reports each job; it is done when the last rank is, and failed if any failed.
                parts = self._partial.setdefault(job_id, [])
                parts.append(result)
                if len(parts) < self.world_size:
                    continue
                del self._partial[job_id]
                result = _merge(parts)
            self._complete(self.records.jobs.pop(job_id), result)
        self._absorb_events()

    def _complete(self, job: JobRecord, result: TransferResult) -> None:
        kind, hashes = job.kind, job.block_hashes
        records = self.records
        if records.fence_of_job:
            records.unfence(job.job.job_id)
        state = records.requests.get(job.req_id) if job.req_id is not None else None
        if kind is JobKind.DEMOTE:
            self.manager.complete_demotion(hashes, result.success, job.medium)
            self._record_io(job.medium, result, write=True)
            self.stats.demoted_blocks += len(hashes) if result.success else 0
            if result.skipped:
                self.stats.tier_stores_skipped[job.medium.lower()] += len(hashes)
        elif kind is JobKind.LOAD:
            self.manager.complete_load(hashes, job.medium)
            records.blocks_being_loaded.difference_update(hashes)
            if state is not None:
                state.loads_in_flight -= 1
                if not state.loads_in_flight:
                    state.loading = None
                    state.sync_load = False
            if result.bad_block_ids:
                # Corrupt, misplaced or unreadable: drop, so the next lookup misses and recomputes.
                self.manager.drop_corrupt(job.medium, list(result.bad_block_ids))
            self._record_io(job.medium, result)
            self.cost.load_ended(job.medium, job.job.job_id, result.seconds if result.success else None)
            tier = job.medium.lower()  # "cpu" / "disk", as stats() reports
            for reason, n in result.rejected:
                self.stats.tier_rejected[(tier, reason)] += n
            if result.success:
                self.stats.loaded_blocks += len(hashes)
                if job.hit_tokens:
                    self.stats.tier_hits[tier] += job.hit_tokens
                    self.stats.tier_hit_blocks[tier] += len(hashes)
            elif result.cancelled:
                self.stats.cancelled_load_blocks += len(hashes)
            else:
                self.stats.failed_load_blocks += len(hashes)
                if job.hit_tokens:
                    self.stats.tier_failed_hits[tier] += job.hit_tokens
        else:  # STORE, SWAP_OUT
            self.manager.complete_store(hashes, result.success)
            if state is not None:
                state.storing.subtract(hashes)
                state.storing = +state.storing
            if result.success:
                self.stats.stored_blocks += len(hashes)
            else:
                self.stats.failed_store_blocks += len(hashes)
        if state is not None and state.finished and not state.busy:
            records.drop(job.req_id)  # type: ignore[arg-type]

    def _record_io(self, medium: str, result: TransferResult, write: bool = False) -> None:
        if result.success or result.io_error:
            self.manager.record_io(medium, result.success, write)

    def request_finished(self, request: EngineRequest, block_ids: GroupBlockIds) -> tuple[bool, dict[str, object] | None]:
        """The engine finished ``request`` (done, aborted or failed, in any phase).

        Exactly one later report frees its blocks, whatever happened in between: a request with
        a load planned or in flight is reported by the worker as finished-*receiving* once the
        load is done (the engine waits for that report on its own, and may already have it in
        the step output it is processing); any other request with copies in flight is reported
        as finished-*sending* (``await_finish``). Reporting both would free it twice.
        """
        rid = request.request_id
        state = self.records.state(rid)
        self.hints.finished(request, state, lambda: self._finished_keys(request))
        # Planned loads are sent anyway: the worker's finished-receiving report is what frees
        # the request's blocks in the engine, so the load must reach the worker.
        delay = state.busy
        if delay:
            if state.loading is None or state.sync_load:  # a synchronous load is never reported received
                self.records.next_step.await_finish.add(rid)
            state.request, state.block_ids, state.swapped, state.finished = None, [], None, True
        else:
            self.records.drop(rid)
        return delay, None

    def _absorb_events(self) -> None:
        """Every step: the tiers' events become KV events while the blocks' descriptions are
        at hand (and the tiers' own queues stay short)."""
        if self.records.events.enabled:
            self.records.events.absorb(self.manager.take_events(), self.records.keys_in_flight)

    def take_events(self) -> list[KVEvent]:
        """KV events in vLLM's schema since the last call (``kvoffload.kv_events``)."""
        self._absorb_events()
        return self.records.events.take()

    def stats_dict(self) -> ConnectorStatsDict:
        return connector_stats(self.stats, self.manager.report(), len(self.records.jobs),
                               self.manager.has_pending_demotions(), self.cost.gauges())
