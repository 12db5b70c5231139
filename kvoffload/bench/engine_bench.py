"""Engine overheads: schedule() per step, prefix lookup per block, model tokens/s.

The baseline for scheduling overhead is the model's own forward time in the same run, so
the printed ratio says how much of a step the scheduler costs on this machine.
"""

from __future__ import annotations

import platform
import time

import torch

from kvoffload.bench.measure import Sample, add_reps, bench_parser, interleaved, preamble
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.engine.request import Request
from kvoffload.engine.scheduler import Scheduler


def _decode_steps(sched: Scheduler, steps: int) -> float:
    """Mean seconds per schedule() call, with a stub runner sampling one token each."""
    spent = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        so = sched.schedule()
        spent += time.perf_counter() - t0
        ids, sampled = [], []
        for rid in so.num_scheduled_tokens:
            req = sched.requests[rid]
            ids.append(rid)
            sampled.append([1] if req.num_computed_tokens >= req.num_tokens else [])
        sched.update_from_output(so, ModelRunnerOutput(ids, sampled))
    return spent / steps


def bench_schedule(num_reqs: int, prompt_len: int, mixed: bool, steps: int = 50) -> float:
    block = 16
    kvm = KVCacheManager(num_reqs * 200 // block + 64, block, 8192)
    sched = Scheduler(kvm, max_num_batched_tokens=2048 if mixed else 8192, max_num_seqs=num_reqs, max_model_len=8192,
                      long_prefill_token_threshold=256 if mixed else 0)
    for i in range(num_reqs):
        sched.add_request(Request(f"r{i}", [(i * 31 + j) % 250 for j in range(prompt_len)],
                                  SamplingParams(max_tokens=10_000, ignore_eos=True), block_size=block))
    if not mixed:
        _decode_steps(sched, 3)  # finish prefills; the timed steps are pure decode
    return _decode_steps(sched, steps)


def bench_prefix_lookup(num_blocks: int = 4096, block: int = 16) -> float:
    kvm = KVCacheManager(num_blocks + 1, block, 1 << 20)
    req = Request("warm", list(range(num_blocks * block)), SamplingParams(max_tokens=1), block_size=block)
    kvm.allocate_slots(req, req.num_tokens)
    kvm.free(req)
    probe = Request("probe", list(range(num_blocks * block)) + [1], SamplingParams(max_tokens=1), block_size=block)
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        _, hit = kvm.get_computed_blocks(probe)
    dt = time.perf_counter() - t0
    assert hit == num_blocks * block
    return dt / (reps * num_blocks)


def bench_model(model: str = "tiny", num_reqs: int = 32, prompt_len: int = 128, max_tokens: int = 32) -> tuple[float, float]:
    """(tokens/s, mean forward seconds per decode step with ``num_reqs`` requests)."""
    with LLM(EngineConfig(model=model, num_gpu_blocks=num_reqs * 12 + 8, max_num_seqs=num_reqs,
                          max_num_batched_tokens=4096, enable_prefix_caching=False)) as llm:
        prompts = [[(i * 13 + j) % 250 for j in range(prompt_len)] for i in range(num_reqs)]
        t0 = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        wall = time.perf_counter() - t0
        steps = llm.stats()["steps"]
    tokens = num_reqs * (prompt_len + max_tokens)
    return tokens / wall, wall / steps


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("engine", __doc__)
    add_reps(parser, default=3)
    args = parser.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads; "
          f"{preamble(args.reps)}")
    throughput: list[float] = []

    def model_step() -> float:
        tps, step = bench_model()
        throughput.append(tps)
        return step

    figures = interleaved({
        "decode": lambda: bench_schedule(256, 64, mixed=False),
        "mixed": lambda: bench_schedule(32, 1024, mixed=True),
        "lookup": bench_prefix_lookup,
        "model": model_step,
    }, args.reps)
    dec, mix, lookup, fwd = figures["decode"], figures["mixed"], figures["lookup"], figures["model"]
    print(f"schedule() with 256 running decode requests : {dec.fmt('8.3f', 1e3)} ms/step")
    print(f"schedule() with 32 mixed prefill/decode     : {mix.fmt('8.3f', 1e3)} ms/step")
    print(f"prefix lookup                               : {lookup.fmt('8.1f', 1e9)} ns/block")
    print(f"tiny model throughput (32 reqs)             : {Sample(tuple(throughput)).fmt('8.0f')} tokens/s")
    print(f"tiny model step time (baseline)             : {fwd.fmt('8.3f', 1e3)} ms/step")
    print(f"ratio schedule(32 mixed) / step time        : {mix.ratio(fwd).fmt('8.3f')}")
