"""Scheduler: one token budget per step shared by decode and prefill (vLLM V1 style).

Running requests are served first; when the pool cannot hold a running request's new tokens,
another running request is preempted (recompute: its blocks are freed and it restarts from
token 0 at the front of the waiting queue). Waiting requests are admitted only in steps that
preempted nobody. An optional KV connector is consulted at five fixed points.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from kvoffload.connector.base import KVConnectorBase, KVConnectorOutput
from kvoffload.engine.admission import Admission
from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.output_builder import OutputBuilder, request_seed
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.engine.preemption import release_preempted
from kvoffload.engine.remote_loads import RemoteLoads
from kvoffload.engine.request import Request, RequestStatus
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.scheduler_output import SchedulerOutput
from kvoffload.engine.scheduler_stats import SchedulerStats
from kvoffload.engine.step_draft import QueuePass, StepDraft, Verdict


class SchedulingPolicy(str, enum.Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        long_prefill_token_threshold: int = 0,
        enable_chunked_prefill: bool = True,
        policy: SchedulingPolicy | str = SchedulingPolicy.FCFS,
        connector: KVConnectorBase | None = None,
        watermark_blocks: int = 0,
        preemption_mode: str = "recompute",
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.policy = SchedulingPolicy(policy)
        self.connector = connector
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode={preemption_mode!r}: use 'recompute' or 'swap'")
        if preemption_mode == "swap" and connector is None:
            raise ValueError("preemption_mode='swap' needs an offload connector: set kv_offload (or kv_connector)")
        self.preemption_mode = preemption_mode
        self.requests: dict[str, Request] = {}
        self._outputs = OutputBuilder(kv_cache_manager)
        #: (parent id, child id) forks since the facade last looked.
        self.forked: list[tuple[str, str]] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        #: Requests whose external load is in flight or landed (they count against max_num_seqs).
        self.remote_loads = RemoteLoads()
        #: Request id -> the group it advances with (beam search sets this); default: itself.
        self.group_of: Callable[[str], str] = lambda rid: rid
        self.stats = SchedulerStats()
        self._admission = Admission(kv_cache_manager, connector, self.remote_loads, self.stats, self.running,
                                    max_num_seqs, enable_chunked_prefill, watermark_blocks, self._clamp_new_tokens)

    # Admission's settings, set there (one place reads them).
    @property
    def max_num_seqs(self) -> int:
        return self._admission.max_num_seqs

    @max_num_seqs.setter
    def max_num_seqs(self, seqs: int) -> None:
        self._admission.max_num_seqs = seqs

    @property
    def enable_chunked_prefill(self) -> bool:
        return self._admission.enable_chunked_prefill

    @property
    def watermark_blocks(self) -> int:
        """Blocks a waiting request may not take while running requests still need room."""
        return self._admission.watermark_blocks

    @watermark_blocks.setter
    def watermark_blocks(self, blocks: int) -> None:
        self._admission.watermark_blocks = blocks

    # ---- request lifecycle --------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already scheduled")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        # A request whose load has not been reported yet keeps its blocks (the load writes into
        # them) until the connector's finished-receiving report, which then frees them.
        awaiting_load = False
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            awaiting_load = self.remote_loads.abort(request.request_id)  # no longer counts against max_num_seqs
        request.status = RequestStatus.FINISHED_ABORTED
        self._free_request(request, delay_free=awaiting_load)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step -----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        step = StepDraft(self.max_num_batched_tokens)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        if not step.num_scheduled and step.stalled and self.waiting and not step.preempted:
            step.preempted += self._break_stall(step.stalled)  # listed: the worker awaits its swap-out copies
        output = self._outputs.build(step.new, step.resumed, step.running, step.new_blocks_of, step.num_scheduled,
                                     step.preempted, self.finished_req_ids)
        self.finished_req_ids = set()
        if self.connector is not None:
            output.kv_connector_metadata = self.connector.build_connector_meta(output)
        self._update_after_schedule(output)
        return output

    def _schedule_running(self, step: StepDraft) -> None:
        """Running requests first, oldest first; preempt the youngest when blocks run out."""
        idx = 0
        while idx < len(self.running) and step.budget > 0:
            request = self.running[idx]
            num_new = self._clamp_new_tokens(request, request.num_tokens - request.num_computed_tokens, step.budget)
            num_new = min(num_new, self.max_model_len - 1 - request.num_computed_tokens)
            if num_new <= 0:
                step.stalled.append(request)  # waits for a token from outside (a beam's siblings)
                idx += 1
                continue
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                victim = self._pick_preemption_victim()
                pos = self.running.index(victim)
                del self.running[pos]
                if pos < idx:
                    idx -= 1
                step.unschedule(victim)
                self._preempt(victim)
                step.preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                return
            step.running.append(request)
            step.schedule(request, new_blocks, num_new)
            idx += 1

    def _schedule_waiting(self, step: StepDraft) -> None:
        """Admit waiting requests in order while budget, seats and blocks last (only in steps
        that preempted nobody). Once the head cannot be admitted, only requests whose load has
        landed are still resumed: they hold their blocks already, and only running them frees
        those blocks (else a blocked head waits forever for blocks held behind it)."""
        adm = QueuePass(num_loading=len(self.remote_loads))
        while self.waiting and step.budget > 0:
            verdict = self._admission.try_admit(self.waiting[0], step, adm)
            if verdict is Verdict.ADMITTED:
                self.waiting.popleft()
            elif verdict is Verdict.SKIP or verdict is Verdict.LOADING:
                adm.skipped.append(self.waiting.popleft())
            elif verdict is Verdict.SKIP_AND_STOP:
                adm.skipped.append(self.waiting.popleft())
                break
            else:  # BLOCKED: skip the head only if landed loads wait behind it
                if adm.landed_left < 0:
                    adm.landed_left = self.remote_loads.num_landed(self.waiting)
                if not adm.landed_left:
                    break
                adm.skipped.append(self.waiting.popleft())
        self.waiting.extendleft(reversed(adm.skipped))

    def _clamp_new_tokens(self, request: Request, num_new: int, budget: int) -> int:
        threshold = self.long_prefill_token_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def _pick_preemption_victim(self) -> Request:
        if self.policy == SchedulingPolicy.PRIORITY:
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _break_stall(self, stalled: list[Request]) -> list[Request]:
        """Nothing could run: every running request waits for a sibling (beam search) that
        cannot be admitted while they hold the seats and blocks. Preempt the youngest stalled
        request of another group to the back of the queue, so the head gets room."""
        head_group = self.group_of(self.waiting[0].request_id)
        for victim in reversed(stalled):
            if self.group_of(victim.request_id) != head_group:
                self.running.remove(victim)
                self._preempt(victim, to_back=True)
                return [victim]
        return []

    def _preempt(self, request: Request, to_back: bool = False) -> None:
        release_preempted(request, self.kv_cache_manager, self.connector if self.preemption_mode == "swap" else None,
                          self.stats)
        if to_back:
            self.waiting.append(request)
        else:
            self.waiting.appendleft(request)

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        self.stats.steps += 1
        for rid, n in output.num_scheduled_tokens.items():
            request = self.requests[rid]
            self.stats.count_scheduled(request, n)
            request.num_computed_tokens += n

    # ---- results ------------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[Request]:
        """Append sampled tokens, finish requests, digest the connector report.

        Returns the requests that finished in this step.
        """
        finished: list[Request] = []
        for rid, tokens in runner_output.rolled_back.items():
            self._roll_back(rid, tokens)
        index = {rid: i for i, rid in enumerate(runner_output.req_ids)}
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is None or request.is_finished or rid not in index:
                continue
            sampled = runner_output.sampled_token_ids[index[rid]]
            if not sampled:
                continue
            base_seed = request_seed(request)
            for i, token in enumerate(sampled[1:], start=1):  # parallel samples: fork the prompt
                params = replace(request.sampling_params, n=1, seed=base_seed + i)
                child = self.fork_request(request, f"{rid}#{i}", params)
                finished += self.append_token(child, token, runner_has_it=True)
            if len(sampled) > 1:
                request.sampling_params = replace(request.sampling_params, n=1, seed=base_seed)
            finished += self.append_token(request, sampled[0], runner_has_it=True)
        kv_out = runner_output.kv_connector_output
        if self.connector is not None and kv_out is not None:
            self._update_from_kv_connector_output(kv_out)
        return finished

    def _roll_back(self, rid: str, tokens: int) -> None:
        """A block ``rid`` read this step was not filled (its synchronous load failed): it
        recomputes from ``tokens`` on, and those blocks serve no prefix hit meanwhile."""
        request = self.requests.get(rid)
        if request is None:
            return
        request.num_computed_tokens = tokens
        self.kv_cache_manager.uncache_from(request, tokens)
        self.stats.failed_loads += 1

    def append_token(self, request: Request, token: int, runner_has_it: bool = False) -> list[Request]:
        """Append one generated token; returns [request] if that finished it."""
        request.append_output_token_ids(token)
        if not runner_has_it:
            self._outputs.appended(request.request_id, token)
        if request.check_stop(self.max_model_len):
            if request in self.running:
                self.running.remove(request)
            elif request in self.waiting:  # a preempted beam finished on candidates it reported before
                self.waiting.remove(request)
            self._free_request(request)
            return [request]
        return []

    def fork_request(self, parent: Request, child_id: str, params: SamplingParams | None = None) -> Request:
        """A running copy of ``parent`` sharing all its blocks (copy-on-write on the next write)."""
        child = parent.fork(child_id, params)
        self.kv_cache_manager.fork(parent, child)
        self.requests[child_id] = child
        self.running.append(child)
        self._outputs.forked(child_id)
        self.forked.append((parent.request_id, child_id))
        return child

    def _update_from_kv_connector_output(self, kv_out: KVConnectorOutput) -> None:
        assert self.connector is not None
        self.connector.update_connector_output(kv_out)
        for request in self.remote_loads.digest(kv_out, self.requests):
            self._free_blocks(request)

    def _free_request(self, request: Request, delay_free: bool = False) -> None:
        assert request.is_finished
        if self.connector is not None:
            connector_delay, _ = self.connector.request_finished(
                request, self.kv_cache_manager.get_block_ids(request.request_id)
            )
            delay_free |= connector_delay
        self.finished_req_ids.add(request.request_id)
        if not delay_free:
            self._free_blocks(request)

    def _free_blocks(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.requests.pop(request.request_id, None)

    def has_pending_frees(self) -> bool:
        """Finished requests whose blocks a connector still holds."""
        return any(r.is_finished for r in self.requests.values())

    def has_pending_transfers(self) -> bool:
        """The connector still has copies to plan or finish (e.g. disk write-through)."""
        return self.connector is not None and self.connector.has_pending_work()

