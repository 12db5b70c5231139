"""OutputBuilder: turns a step's scheduling decisions into the runner's SchedulerOutput.

The runner keeps each request's rows between steps, so a continuing request is sent as a diff
(new block ids, computed count); a new request, a resumed one and a forked child the runner
has never seen are sent in full. Tokens appended by the scheduler itself (beam search) ride
along in the diff until the runner has them.
"""

from __future__ import annotations

from kvoffload.engine.kv_cache_manager import KVCacheBlocks, KVCacheManager
from kvoffload.engine.request import Request
from kvoffload.engine.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput


def request_seed(request: Request) -> int:
    seed = request.sampling_params.seed
    return seed if seed is not None else request.seed


class OutputBuilder:
    def __init__(self, kv_cache_manager: KVCacheManager) -> None:
        self.kv_cache_manager = kv_cache_manager
        #: Running requests the runner has not seen yet (forked children): sent in full.
        self._unsent: set[str] = set()
        #: Tokens appended by the scheduler (beam search) that the runner has not seen.
        self._unsent_tokens: dict[str, list[int]] = {}

    def forked(self, child_id: str) -> None:
        self._unsent.add(child_id)

    def appended(self, rid: str, token: int) -> None:
        """The scheduler appended ``token`` to ``rid`` (the runner did not sample it)."""
        if rid not in self._unsent:
            self._unsent_tokens.setdefault(rid, []).append(token)

    def build(
        self,
        new: list[Request],
        resumed: list[Request],
        running: list[Request],
        new_blocks_of: dict[str, KVCacheBlocks],
        num_scheduled: dict[str, int],
        preempted: list[Request],
        finished_req_ids: set[str],
    ) -> SchedulerOutput:
        # Forked children the runner has not seen go out in full, also when they were
        # preempted before their first step and now resume.
        unsent = [r for r in running + resumed if r.request_id in self._unsent]
        running = [r for r in running if r.request_id not in self._unsent]
        resumed = [r for r in resumed if r.request_id not in self._unsent]
        self._unsent.difference_update(r.request_id for r in unsent)
        block_ids = self.kv_cache_manager.get_block_ids
        new_data = [
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=list(r.all_token_ids),
                sampling_params=r.sampling_params,
                block_ids=block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens,
                seed=request_seed(r),
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
            fresh = new_blocks_of[r.request_id]
            # None when no group got a block, as vLLM sends it (most decode steps): the connector
            # and runner skip such a request's block bookkeeping.
            cached.new_block_ids.append(fresh.get_block_ids() if any(fresh.blocks) else None)
            cached.num_computed_tokens.append(r.num_computed_tokens)
        for r in resumed:
            cached.new_token_ids.append([])
            cached.req_ids.append(r.request_id)
            cached.resumed_from_preemption.append(True)
            cached.resumed_token_ids.append(list(r.all_token_ids))
            cached.new_block_ids.append(block_ids(r.request_id))
            cached.num_computed_tokens.append(r.num_computed_tokens)
        output = SchedulerOutput(
            scheduled_new_reqs=new_data,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            preempted_req_ids={r.request_id for r in preempted},
            finished_req_ids=finished_req_ids,
        )
        output.blocks_to_copy, output.block_replacements = self.kv_cache_manager.take_copy_on_write()
        return output
