"""The multi-turn chat workload with and without CPU offload: TTFT and prefill tokens."""

from __future__ import annotations

import time

from tqdm import tqdm

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble
from kvoffload.engine import LLM, EngineConfig
from kvoffload.report import percentile
from kvoffload.workload import ChatWorkload, run_chat_workload


def run(wl: ChatWorkload, blocks: int, kv_offload: dict | None, model: str) -> tuple[list[list[int]], dict, float]:
    cfg = EngineConfig(model=model, num_gpu_blocks=blocks, max_num_seqs=4, max_num_batched_tokens=512, kv_offload=kv_offload)
    with LLM(cfg) as llm:
        t0 = time.perf_counter()
        tokens = run_chat_workload(llm, wl)
        return tokens, llm.stats(), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("e2e", __doc__)
    parser.add_argument("--model", default="small", help="tiny, small, or a Llama checkpoint directory")
    parser.add_argument("--num-gpu-blocks", type=int, default=96, help="device KV cache, in blocks of 16 tokens")
    parser.add_argument("--conversations", type=int, default=16, help="chats, each on its own 256-token prompt")
    parser.add_argument("--turns", type=int, default=4, help="turns per chat (64 user tokens, 16 generated each)")
    add_reps(parser, default=3)
    args = parser.parse_args(argv)
    wl = ChatWorkload(conversations=args.conversations, turns=args.turns, system_tokens=256, user_tokens=64, max_tokens=16)
    offload = {"tiers": [{"name": "cpu", "medium": "cpu", "capacity": "256MiB"}]}
    print(f"model={args.model} device blocks={args.num_gpu_blocks} x 16 tokens, "
          f"{args.conversations} chats x {args.turns} turns; {preamble(args.reps)}")
    timings: dict[str, dict[str, list[float]]] = {"base": {}, "off": {}}
    identical = True
    for _ in tqdm(range(args.reps), desc="runs (each: no offload, then cpu offload)", unit="rep", disable=None):
        # alternating, so drift hits both alike
        base_tokens, base, base_s = run(wl, args.num_gpu_blocks, None, args.model)
        off_tokens, off, off_s = run(wl, args.num_gpu_blocks, offload, args.model)
        identical = identical and base_tokens == off_tokens
        for side, stats, wall in (("base", base, base_s), ("off", off, off_s)):
            timings[side].setdefault("TTFT p50 (ms)", []).append(1000 * percentile(stats["ttft_s"], 0.5))
            timings[side].setdefault("TTFT p95 (ms)", []).append(1000 * percentile(stats["ttft_s"], 0.95))
            timings[side].setdefault("wall time (s)", []).append(wall)
    print(f"{'':<26}{'no offload':>16}{'cpu offload':>16}{'ratio':>14}")
    a, b = base["prefill_tokens_computed"], off["prefill_tokens_computed"]
    print(f"{'prefill tokens computed':<26}{a:>16}{b:>16}{b / a if a else 0:>14.2f}")
    for name in timings["base"]:
        x, y = Sample(tuple(timings["base"][name])), Sample(tuple(timings["off"][name]))
        print(f"{name:<26}{x.fmt('.1f'):>16}{y.fmt('.1f'):>16}{y.ratio(x).fmt():>14}")
    print(f"cpu-tier hit tokens: {off['prefix_hit_tokens']['cpu']}, outputs identical: {identical}")
