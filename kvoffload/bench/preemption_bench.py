"""Recompute vs swap preemption on a workload that forces preemption (long requests, small
device cache): prefill tokens computed, throughput, p95 TTFT, side by side."""

from __future__ import annotations

import time

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.report import percentile


def run(mode: str, prompts: list[list[int]], blocks: int, max_tokens: int) -> tuple[list[list[int]], dict, float]:
    offload = {"tiers": [{"medium": "cpu", "capacity": "256MiB"}]} if mode == "swap" else None
    cfg = EngineConfig(model="tiny", num_gpu_blocks=blocks, max_num_seqs=8, max_num_batched_tokens=512,
                       kv_offload=offload, preemption_mode=mode)
    with LLM(cfg) as llm:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return [o.token_ids for o in outs], llm.stats(), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("preemption", __doc__)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--num-gpu-blocks", type=int, default=80)
    add_reps(parser, default=3)
    args = parser.parse_args(argv)
    prompts = [[(i * 131 + j * 7) % 250 for j in range(args.prompt_tokens + 5 * i)] for i in range(args.requests)]
    toks = sum(len(p) for p in prompts) + args.requests * args.max_tokens
    print(f"{args.requests} requests x ~{args.prompt_tokens} prompt tokens, {args.max_tokens} generated, "
          f"{args.num_gpu_blocks} device blocks of 16 tokens; {preamble(args.reps)}")
    speed: dict[str, list[float]] = {"recompute": [], "swap": []}
    ttft: dict[str, list[float]] = {"recompute": [], "swap": []}
    identical = True
    for _ in range(args.reps):  # alternating, so drift hits both alike
        rec_tokens, rec, rec_s = run("recompute", prompts, args.num_gpu_blocks, args.max_tokens)
        swp_tokens, swp, swp_s = run("swap", prompts, args.num_gpu_blocks, args.max_tokens)
        identical = identical and rec_tokens == swp_tokens
        for mode, stats, wall in (("recompute", rec, rec_s), ("swap", swp, swp_s)):
            speed[mode].append(toks / wall)
            ttft[mode].append(1000 * percentile(stats["ttft_s"], 0.95))
    print(f"{'':<30}{'recompute':>16}{'swap':>16}{'swap/recompute':>16}")
    for name, key in (("preemptions", "preemptions"), ("prefill tokens computed", "prefill_tokens_computed"),
                      ("recomputed after preemption", "recomputed_after_preemption")):
        a, b = rec[key], swp[key]
        print(f"{name:<30}{a:>16}{b:>16}{(b / a if a else 0):>16.2f}")
    for name, figure in (("tokens/s", speed), ("TTFT p95 (ms)", ttft)):
        a, b = Sample(tuple(figure["recompute"])), Sample(tuple(figure["swap"]))
        print(f"{name:<30}{a.fmt('.1f'):>16}{b.fmt('.1f'):>16}{b.ratio(a).fmt():>16}")
    print(f"outputs identical: {identical}")
