"""``kvoffload bench plan``: `kvoffload plan`'s predictions against live runs of the bundled
engine. Each workload runs without offload (its request log is written, as a server keeps
one), then with each tier configuration; `plan` replays the log through the same chains,
priced by this machine's profile; the report shows predicted and measured tokens per tier and
returning-turn TTFT p50, with their ratios (predicted / measured). Device tokens are the
prompts' hits in the device cache (a preempted request finding its own blocks again is not
counted)."""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

from kvoffload.bench.measure import add_reps, bench_parser, preamble
from kvoffload.bench.serve_workloads import Workload

BLOCK = 16


def _workloads(args: Any) -> dict[str, Workload]:
    from kvoffload.bench import serve_workloads

    out = {"chat": serve_workloads.chat(conversations=args.conversations, turns=4, context=args.context, user=64,
                                        max_tokens=16, think_s=0.2, vocab=250)}
    if args.weka:
        out["weka"] = serve_workloads.weka(args.weka, conversations=6, turns=6, block_tokens=1, max_blocks=1200,
                                           time_scale=0.01, max_tokens=8, vocab=250)
    return out


def _run(wl: Workload, tiers: list[dict[str, Any]] | None, device_blocks: int, mbt: int
         ) -> tuple[list[tuple[str, int, Any]], dict[str, int]]:
    from kvoffload.bench.serve_bundled import run_bundled
    from kvoffload.engine import LLM, EngineConfig

    max_len = math.ceil((wl.max_context + 1) / BLOCK) * BLOCK
    cfg = EngineConfig(model="tiny", block_size=BLOCK, num_gpu_blocks=device_blocks + 1, max_model_len=max_len,
                       max_num_seqs=max(8, wl.concurrency), max_num_batched_tokens=mbt,
                       kv_offload=None if tiers is None else {"tiers": tiers, "load_mode": "async"})
    with LLM(cfg) as llm:
        turns, _ = run_bundled(llm, wl)
        stats = llm.stats()
    hits = {k: v for k, v in stats["prefix_hit_tokens"].items() if k != "device"}
    # The device's hits on prompts: a preempted request re-finding its own blocks is not reuse.
    hits["device"] = max(0, stats["prompt_hit_tokens"] - sum(hits.values()))
    return turns, hits


def _p50_returning(turns: list[tuple[str, int, Any]]) -> float:
    vals = [c.ttft for _, t, c in turns if t > 0 and c.ttft is not None]
    return statistics.median(vals) if vals else 0.0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("plan", __doc__)
    p.add_argument("--profile", default=None, help="speeds YAML (default: measure this machine now)")
    p.add_argument("--conversations", type=int, default=8, help="chat workload: conversations")
    p.add_argument("--context", type=int, default=768, help="chat workload: each conversation's opening tokens")
    p.add_argument("--weka", default=None, help="WEKA traces .tar.gz: also validate on a slice of it")
    p.add_argument("--device-fraction", type=float, default=0.25, help="device cache as a share of the working set")
    p.add_argument("--max-batched-tokens", type=int, default=512, help="the engine's step budget")
    add_reps(p, 1)
    args = p.parse_args(argv)
    import torch

    from kvoffload.plan.log_reader import read_log
    from kvoffload.plan.model_shape import kv_shape
    from kvoffload.plan.planner import make_plan
    from kvoffload.plan.profile import load_profile
    from kvoffload.plan.tier_spec import parse_chain

    torch.set_num_threads(1)
    print(preamble(args.reps))
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile is None:
            from kvoffload.bench.profile_bench import measure_prefill, measure_tier
            from kvoffload.plan.profile import Profile

            engine = measure_prefill("tiny", BLOCK, args.max_batched_tokens, 3)
            speeds = {m: measure_tier(m, "tiny", BLOCK, args.max_batched_tokens, 3, tmp) for m in ("cpu", "disk")}
            profile = Profile(engine, speeds, "measured now")
        else:
            profile = load_profile(args.profile)
        block_bytes = kv_shape("tiny").bytes_per_token * BLOCK
        for name, wl in _workloads(args).items():
            ws_blocks = math.ceil(wl.working_set_tokens / BLOCK)
            device = max(math.ceil(args.device_fraction * ws_blocks), wl.max_context // BLOCK + 2)
            big, small = ws_blocks * 2 * block_bytes, max(ws_blocks // 4, 64) * block_bytes
            configs = {f"cpu:{big}B": [{"name": "cpu", "medium": "cpu", "capacity": f"{big}B"}],
                       f"cpu:{small}B+disk:{big}B": [
                           {"name": "cpu", "medium": "cpu", "capacity": f"{small}B"},
                           {"name": "disk", "medium": "disk", "capacity": f"{big}B", "path": f"{tmp}/{name}-disk"}]}
            print(f"\n{name}: {len(wl.sessions)} sessions, working set {ws_blocks} blocks, device {device} blocks")
            for rep in range(args.reps):
                base_turns, base_hits = _run(wl, None, device, args.max_batched_tokens)
                log = Path(tmp) / f"{name}-{rep}.jsonl"
                from kvoffload.bench.served_log import write_served_log

                write_served_log(wl, base_turns, log)
                rlog = read_log(log, BLOCK, vocab=258, output_tokens=wl.max_tokens)
                chains = [parse_chain(spec) for spec in configs]
                plan = make_plan(rlog, chains, block_bytes, device, profile, wl.max_tokens)
                base_ms = _p50_returning(base_turns) * 1e3
                print(f"  no offload: returning TTFT p50 measured {base_ms:.1f} ms, predicted "
                      f"{plan.results[0].base_ttft_p50_s * 1e3:.1f} ms (ratio "
                      f"{plan.results[0].base_ttft_p50_s * 1e3 / base_ms:.2f}); device tokens measured "
                      f"{base_hits['device']:,}, predicted {plan.results[0].device_tokens:,}")
                for (_label, tiers), res in zip(configs.items(), plan.results):
                    turns, hits = _run(wl, tiers, device, args.max_batched_tokens)
                    ms = _p50_returning(turns) * 1e3
                    parts = [f"device {hits['device']:,} vs {res.device_tokens:,}"]
                    for t in res.tiers:
                        got = hits.get(t.medium, 0)
                        ratio = f"{t.tokens_served / got:.2f}" if got else "-"
                        parts.append(f"{t.medium} {got:,} vs {t.tokens_served:,} ({ratio})")
                    print(f"  {res.label}: tokens measured vs predicted: {'; '.join(parts)}; returning TTFT p50 "
                          f"measured {ms:.1f} ms, predicted {res.ttft_p50_s * 1e3:.1f} ms (ratio "
                          f"{res.ttft_p50_s * 1e3 / ms:.2f})")
    return 0
