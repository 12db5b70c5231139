"""The multi-turn chat workload with and without CPU offload: TTFT and prefill tokens."""

from __future__ import annotations

import argparse
import time

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
    parser = argparse.ArgumentParser(prog="kvoffload bench e2e")
    parser.add_argument("--model", default="small")
    parser.add_argument("--num-gpu-blocks", type=int, default=96)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args(argv)
    wl = ChatWorkload(conversations=args.conversations, turns=args.turns, system_tokens=256, user_tokens=64, max_tokens=16)
    offload = {"tiers": [{"name": "cpu", "medium": "cpu", "capacity": "256MiB"}]}
    base_tokens, base, base_s = run(wl, args.num_gpu_blocks, None, args.model)
    off_tokens, off, off_s = run(wl, args.num_gpu_blocks, offload, args.model)
    print(f"model={args.model} device blocks={args.num_gpu_blocks} x 16 tokens, "
          f"{args.conversations} chats x {args.turns} turns")
    print(f"{'':<26}{'no offload':>12}{'cpu offload':>12}{'ratio':>8}")
    rows = [
        ("prefill tokens computed", base["prefill_tokens_computed"], off["prefill_tokens_computed"]),
        ("TTFT p50 (ms)", 1000 * percentile(base["ttft_s"], 0.5), 1000 * percentile(off["ttft_s"], 0.5)),
        ("TTFT p95 (ms)", 1000 * percentile(base["ttft_s"], 0.95), 1000 * percentile(off["ttft_s"], 0.95)),
        ("wall time (s)", base_s, off_s),
    ]
    for name, a, b in rows:
        print(f"{name:<26}{a:>12.1f}{b:>12.1f}{b / a if a else 0:>8.2f}")
    print(f"cpu-tier hit tokens: {off['prefix_hit_tokens']['cpu']}, outputs identical: {base_tokens == off_tokens}")
