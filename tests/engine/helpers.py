"""Drive the scheduler without a model: every completed prefill/decode samples token 7."""

from __future__ import annotations

from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.engine.request import Request
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.scheduler import Scheduler
from kvoffload.engine.scheduler_output import SchedulerOutput


def make_scheduler(num_blocks=64, block_size=4, budget=64, max_seqs=16, max_len=512, threshold=0,
                   policy="fcfs", connector=None, caching=True) -> Scheduler:
    kvm = KVCacheManager(num_blocks, block_size, max_len, enable_caching=caching)
    return Scheduler(kvm, budget, max_seqs, max_len, long_prefill_token_threshold=threshold,
                     policy=policy, connector=connector)


def make_request(rid: str, num_tokens: int, max_tokens=4, block_size=4, priority=0, start=0, arrival=None) -> Request:
    kwargs = {} if arrival is None else {"arrival_time": arrival}
    return Request(rid, list(range(start, start + num_tokens)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   block_size=block_size, priority=priority, **kwargs)


def fake_run(sched: Scheduler, so: SchedulerOutput, token: int = 7) -> list[Request]:
    req_ids, sampled = [], []
    for rid, n in so.num_scheduled_tokens.items():
        req = sched.requests[rid]
        req_ids.append(rid)
        sampled.append([token] if req.num_computed_tokens >= req.num_tokens else [])
    return sched.update_from_output(so, ModelRunnerOutput(req_ids, sampled))
