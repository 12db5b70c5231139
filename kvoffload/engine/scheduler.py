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
from dataclasses import dataclass, replace

from kvoffload.connector.base import KVConnectorBase, KVConnectorOutput
from kvoffload.engine.kv_cache_manager import KVCacheBlocks, KVCacheManager
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.engine.request import Request, RequestStatus
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput


class SchedulingPolicy(str, enum.Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"


@dataclass(slots=True)
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    prefill_tokens_computed: int = 0
    decode_tokens: int = 0
    #: Hits at every admission (a preempted request is admitted again and hits again).
    device_hit_tokens: int = 0
    external_hit_tokens: int = 0
    #: Hits at each request's first admission only: at most its prompt, so a hit rate of it
    #: over prompt tokens never exceeds 100%.
    prompt_hit_tokens: int = 0
    failed_loads: int = 0
    #: External hit tokens planned whose load failed (the request recomputed them).
    failed_external_hit_tokens: int = 0
    swapped_out_tokens: int = 0
    recomputed_after_preemption: int = 0


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
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = SchedulingPolicy(policy)
        self.connector = connector
        #: Blocks a waiting request may not take while running requests still need room.
        self.watermark_blocks = watermark_blocks
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode={preemption_mode!r}: use 'recompute' or 'swap'")
        if preemption_mode == "swap" and connector is None:
            raise ValueError("preemption_mode='swap' needs an offload connector: set kv_offload (or kv_connector)")
        self.preemption_mode = preemption_mode
        self.requests: dict[str, Request] = {}
        #: Running requests the runner has not seen yet (forked children): sent in full.
        self._unsent: set[str] = set()
        #: Tokens appended here (beam search) that the runner has not seen, per request.
        self._unsent_tokens: dict[str, list[int]] = {}
        #: (parent id, child id) forks since the facade last looked.
        self.forked: list[tuple[str, str]] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        #: Requests whose external load is in flight: (tokens computed once it lands, device hit
        #: tokens, external hit tokens). They count against max_num_seqs.
        self._pending_loads: dict[str, tuple[int, int, int]] = {}
        #: Request id -> the group it advances with (beam search sets this); default: itself.
        self.group_of: Callable[[str], str] = lambda rid: rid
        self.stats = SchedulerStats()

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
            rid = request.request_id
            awaiting_load = rid not in self.finished_recving_kv_req_ids and rid not in self.failed_recving_kv_req_ids
            self.finished_recving_kv_req_ids.discard(rid)
            self.failed_recving_kv_req_ids.discard(rid)
            self._pending_loads.pop(rid, None)  # it no longer counts against max_num_seqs
        request.status = RequestStatus.FINISHED_ABORTED
        self._free_request(request, delay_free=awaiting_load)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step -----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_blocks_of: dict[str, KVCacheBlocks] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        scheduled_resumed: list[Request] = []
        preempted: list[Request] = []
        stalled: list[Request] = []

        idx = 0
        while idx < len(self.running) and budget > 0:
            request = self.running[idx]
            num_new = self._clamp_new_tokens(request, request.num_tokens - request.num_computed_tokens, budget)
            num_new = min(num_new, self.max_model_len - 1 - request.num_computed_tokens)
            if num_new <= 0:
                stalled.append(request)  # waits for a token from outside (a beam's siblings)
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
                if victim in scheduled_running:
                    scheduled_running.remove(victim)
                    budget += num_scheduled.pop(victim.request_id)
                    new_blocks_of.pop(victim.request_id, None)
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break
            scheduled_running.append(request)
            new_blocks_of[request.request_id] = new_blocks
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            idx += 1

        skipped: deque[Request] = deque()
        if not preempted:
            # Requests loading external KV hold blocks, so they count against max_num_seqs.
            num_loading = len(self._pending_loads)
            # Once the head cannot be admitted, only requests whose load has landed are still
            # resumed: they hold their blocks already, and only running them frees those blocks
            # (else a blocked head waits forever for blocks held behind it).
            landed_left = -1

            def skip_blocked_head() -> bool:
                """The head cannot be admitted: skip it if landed loads wait behind it."""
                nonlocal landed_left
                if landed_left < 0:
                    landed_left = self._num_landed()
                if landed_left:
                    skipped.append(self.waiting.popleft())
                return landed_left > 0

            while self.waiting and budget > 0:
                request = self.waiting[0]
                if landed_left >= 0 and not self._load_landed(request):
                    skipped.append(self.waiting.popleft())
                    continue
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    if not self._update_waiting_for_remote_kv(request):
                        skipped.append(self.waiting.popleft())
                        continue
                    num_loading -= 1
                    if landed_left >= 0:
                        landed_left -= 1
                        if request.num_computed_tokens == 0:  # its load failed: it queues anew
                            skipped.append(self.waiting.popleft())
                            if not landed_left:
                                break
                            continue
                elif len(self.running) + num_loading >= self.max_num_seqs:
                    if skip_blocked_head():
                        continue
                    break
                load_async = False
                num_external = 0
                if request.num_computed_tokens == 0:
                    computed_blocks, num_local = self.kv_cache_manager.get_computed_blocks(request)
                    if self.connector is not None:
                        matched, load_async = self.connector.get_num_new_matched_tokens(request, num_local)
                        if matched is None:
                            skipped.append(self.waiting.popleft())
                            continue
                        num_external = matched
                    num_computed = num_local + num_external
                else:
                    computed_blocks, num_local = self.kv_cache_manager.empty_blocks(), 0
                    num_computed = request.num_computed_tokens
                if load_async:
                    num_new = 0
                else:
                    num_new = request.num_tokens - num_computed
                    if not self.enable_chunked_prefill and num_new > budget:
                        if skip_blocked_head():
                            continue
                        break
                    num_new = self._clamp_new_tokens(request, num_new, budget)
                    assert num_new > 0, f"request {request.request_id} has nothing left to compute"
                # An async load also reserves its prompt's remaining blocks, so a request whose
                # load landed never waits for room while holding blocks (no hold-and-wait).
                reserve = request.num_tokens - num_computed if load_async else 0
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request,
                    num_new,
                    num_local,
                    computed_blocks,
                    num_lookahead_tokens=reserve,
                    num_external_computed_tokens=num_external,
                    delay_cache_blocks=load_async,
                    reserve_blocks=self.watermark_blocks if self.running else 0,
                )
                if new_blocks is None:
                    if skip_blocked_head():
                        continue
                    break
                if self.connector is not None:
                    self.connector.update_state_after_alloc(
                        request, computed_blocks + new_blocks, num_external
                    )
                self.waiting.popleft()
                if load_async:  # hits count once the load lands (a failed one serves nothing)
                    self._pending_loads[request.request_id] = (num_computed, num_local, num_external)
                    num_loading += 1
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    skipped.append(request)
                    continue
                self.stats.device_hit_tokens += num_local
                self.stats.external_hit_tokens += num_external
                self.running.append(request)
                if request.status == RequestStatus.PREEMPTED:
                    scheduled_resumed.append(request)
                else:
                    scheduled_new.append(request)
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed
                if request.num_cached_tokens < 0:  # first admission: what its prompt found cached
                    request.num_cached_tokens = num_computed
                    self.stats.prompt_hit_tokens += num_computed
                new_blocks_of[request.request_id] = new_blocks
                num_scheduled[request.request_id] = num_new
                budget -= num_new
        self.waiting.extendleft(reversed(skipped))
        if not num_scheduled and stalled and self.waiting and not preempted:
            preempted += self._break_stall(stalled)  # listed: the worker awaits its swap-out copies

        output = self._build_output(
            scheduled_new, scheduled_resumed, scheduled_running, new_blocks_of, num_scheduled, preempted
        )
        if self.connector is not None:
            output.kv_connector_metadata = self.connector.build_connector_meta(output)
        self._update_after_schedule(output)
        return output

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
        request.swapped_tokens = 0
        request.computed_before_preemption = max(request.computed_before_preemption, request.num_computed_tokens)
        # A copy-on-write planned this step for this request never runs: swap out the source.
        redirect = self.kv_cache_manager.cancel_copy_on_write(request.request_id)
        if self.preemption_mode == "swap" and self.connector is not None:
            groups = self.kv_cache_manager.get_block_ids(request.request_id)
            ids = tuple([redirect.get(b, b) for b in group] for group in groups)
            if self.connector.swap_out(request, ids):
                request.swapped_tokens = request.num_computed_tokens
                self.stats.swapped_out_tokens += request.num_computed_tokens
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.stats.preemptions += 1
        if to_back:
            self.waiting.append(request)
        else:
            self.waiting.appendleft(request)

    def _load_landed(self, request: Request) -> bool:
        rid = request.request_id
        return request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and (
            rid in self.finished_recving_kv_req_ids or rid in self.failed_recving_kv_req_ids
        )

    def _num_landed(self) -> int:
        """Waiting requests whose external load has landed (finished or failed)."""
        return sum(1 for r in self.waiting if self._load_landed(r))

    def _update_waiting_for_remote_kv(self, request: Request) -> bool:
        """A request whose external load finished becomes schedulable again."""
        rid = request.request_id
        if rid in self.failed_recving_kv_req_ids:
            # Recompute everything the load should have delivered: keep only local hits.
            self.failed_recving_kv_req_ids.discard(rid)
            self.stats.failed_loads += 1
            self.stats.failed_external_hit_tokens += self._pending_loads.pop(rid, (0, 0, 0))[2]
            self.kv_cache_manager.free(request)
            request.num_computed_tokens = 0
            request.status = RequestStatus.WAITING
            return True
        if rid not in self.finished_recving_kv_req_ids:
            return False
        self.finished_recving_kv_req_ids.discard(rid)
        pending_computed, num_local, num_external = self._pending_loads.pop(rid)
        self.stats.device_hit_tokens += num_local
        self.stats.external_hit_tokens += num_external
        num_computed = min(pending_computed, request.num_tokens - 1)
        self.kv_cache_manager.cache_blocks(request, num_computed)
        request.num_computed_tokens = num_computed
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        return True

    def _build_output(
        self,
        new: list[Request],
        resumed: list[Request],
        running: list[Request],
        new_blocks_of: dict[str, KVCacheBlocks],
        num_scheduled: dict[str, int],
        preempted: list[Request],
    ) -> SchedulerOutput:
        # Forked children the runner has not seen go out in full, also when they were
        # preempted before their first step and now resume.
        unsent = [r for r in running + resumed if r.request_id in self._unsent]
        running = [r for r in running if r.request_id not in self._unsent]
        resumed = [r for r in resumed if r.request_id not in self._unsent]
        self._unsent.difference_update(r.request_id for r in unsent)
        new_data = [
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=list(r.all_token_ids),
                sampling_params=r.sampling_params,
                block_ids=self.kv_cache_manager.get_block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens,
                seed=_request_seed(r),
                num_prompt_tokens=r.num_prompt_tokens,
            )
            for r in new + unsent
        ]
        for r in new + unsent + resumed:
            self._unsent_tokens.pop(r.request_id, None)
        cached = CachedRequestData()
        for r in running:
            cached.new_token_ids.append(self._unsent_tokens.pop(r.request_id, []))
            cached.req_ids.append(r.request_id)
            cached.resumed_from_preemption.append(False)
            cached.resumed_token_ids.append(None)
            cached.new_block_ids.append(new_blocks_of[r.request_id].get_block_ids())
            cached.num_computed_tokens.append(r.num_computed_tokens)
        for r in resumed:
            cached.new_token_ids.append([])
            cached.req_ids.append(r.request_id)
            cached.resumed_from_preemption.append(True)
            cached.resumed_token_ids.append(list(r.all_token_ids))
            cached.new_block_ids.append(self.kv_cache_manager.get_block_ids(r.request_id))
            cached.num_computed_tokens.append(r.num_computed_tokens)
        output = SchedulerOutput(
            scheduled_new_reqs=new_data,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            preempted_req_ids={r.request_id for r in preempted},
            finished_req_ids=self.finished_req_ids,
        )
        output.blocks_to_copy, output.block_replacements = self.kv_cache_manager.take_copy_on_write()
        self.finished_req_ids = set()
        return output

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        self.stats.steps += 1
        for rid, n in output.num_scheduled_tokens.items():
            request = self.requests[rid]
            is_decode = request.num_output_tokens > 0 and request.num_computed_tokens == request.num_tokens - 1
            if is_decode:
                self.stats.decode_tokens += n
            else:
                self.stats.prefill_tokens_computed += n
                # Only tokens whose KV existed before a preemption count as recomputed.
                lost = min(request.num_computed_tokens + n, request.computed_before_preemption)
                self.stats.recomputed_after_preemption += max(0, lost - request.num_computed_tokens)
            request.num_computed_tokens += n

    # ---- results ------------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[Request]:
        """Append sampled tokens, finish requests, digest the connector report.

        Returns the requests that finished in this step.
        """
        finished: list[Request] = []
        index = {rid: i for i, rid in enumerate(runner_output.req_ids)}
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is None or request.is_finished or rid not in index:
                continue
            sampled = runner_output.sampled_token_ids[index[rid]]
            if not sampled:
                continue
            base_seed = _request_seed(request)
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

    def append_token(self, request: Request, token: int, runner_has_it: bool = False) -> list[Request]:
        """Append one generated token; returns [request] if that finished it."""
        request.append_output_token_ids(token)
        if not runner_has_it and request.request_id not in self._unsent:
            self._unsent_tokens.setdefault(request.request_id, []).append(token)
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
        child = Request(
            request_id=child_id,
            prompt_token_ids=list(parent.prompt_token_ids),
            sampling_params=params or parent.sampling_params,
            block_size=parent.block_size,
            eos_token_id=parent.eos_token_id,
            priority=parent.priority,
            cache_salt=parent.cache_salt,
            extra_keys=parent.extra_keys,
            seed=parent.seed,
        )
        child.output_token_ids = list(parent.output_token_ids)
        child.all_token_ids = list(parent.all_token_ids)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.arrival_time = parent.arrival_time
        child.first_token_time = parent.first_token_time
        child.status = RequestStatus.RUNNING
        self.kv_cache_manager.fork(parent, child)
        self.requests[child_id] = child
        self.running.append(child)
        self._unsent.add(child_id)
        self.forked.append((parent.request_id, child_id))
        return child

    def _update_from_kv_connector_output(self, kv_out: KVConnectorOutput) -> None:
        """Digest the worker's report. As in vLLM, every request it names must still be known
        (a finished one is freed by the report); a second report of one request is a
        connector bug and fails loudly here, as it would kill vLLM's engine."""
        assert self.connector is not None
        self.connector.update_connector_output(kv_out)
        for rid in kv_out.finished_recving | kv_out.failed_recving:
            request = self.requests.get(rid)
            assert request is not None, f"connector reported request {rid!r} as received after it was freed"
            if request.is_finished:  # finished while loading: this report frees it
                self._free_blocks(request)
            elif rid in kv_out.failed_recving:
                self.failed_recving_kv_req_ids.add(rid)
            else:
                assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
                    f"connector reported request {rid!r} as received while it is {request.status.name}")
                self.finished_recving_kv_req_ids.add(rid)
        for rid in kv_out.finished_sending:
            request = self.requests.get(rid)
            assert request is not None and request.is_finished, (
                f"connector reported request {rid!r} as sent while it is "
                f"{'freed' if request is None else request.status.name}")
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


def _request_seed(request: Request) -> int:
    seed = request.sampling_params.seed
    return seed if seed is not None else request.seed
