"""``kvoffload bench plan``: `kvoffload plan`'s predictions against live runs of the bundled
engine. Each workload runs without offload (its request log is written, as a server keeps
one, and its steps are timed: the engine's speed is fitted on them), then with each tier
configuration; `plan` replays the log through the same chains, priced by that fit and this
machine's tier speeds; the report shows predicted and measured tokens per tier and
returning-turn TTFT p50, with their ratios (predicted / measured), then the median ratios.
"Prompt tokens cached" is what each request found cached (device and tiers) when first
admitted; a tier's tokens are the engine's counter, which also counts a preempted request's
blocks loaded again (the run's preemptions are shown)."""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble
from kvoffload.bench.serve_workloads import Workload
from kvoffload.bench.served_log import write_served_log
from kvoffload.plan.tier_spec import PlannedTier

BLOCK = 16


def _workloads(args: Any) -> dict[str, Workload]:
    from kvoffload.bench import serve_workloads

    out = {"chat": serve_workloads.chat(conversations=args.conversations, turns=4, context=args.context, user=64,
                                        max_tokens=16, think_s=0.2, vocab=250)}
    if args.weka:
        out["weka"] = serve_workloads.weka(args.weka, conversations=6, turns=6, block_tokens=1, max_blocks=1200,
                                           time_scale=0.01, max_tokens=8, vocab=250)
    return out


def _run(wl: Workload, tiers: list[dict[str, Any]] | None, device_blocks: int, mbt: int,
         steps: list[tuple[dict[str, float], float]] | None = None) -> tuple[list[tuple[str, int, Any]], dict[str, Any]]:
    """One run of ``wl``; ``steps`` (if given) receives each step's terms and seconds."""
    from kvoffload.bench.profile_bench import StepRecorder
    from kvoffload.bench.serve_bundled import run_bundled
    from kvoffload.engine import LLM, EngineConfig

    max_len = math.ceil((wl.max_context + 1) / BLOCK) * BLOCK
    cfg = EngineConfig(model="tiny", block_size=BLOCK, num_gpu_blocks=device_blocks + 1, max_model_len=max_len,
                       max_num_seqs=max(8, wl.concurrency), max_num_batched_tokens=mbt,
                       kv_offload=None if tiers is None else {"tiers": tiers, "load_mode": "async"})
    with LLM(cfg) as llm:
        rec = StepRecorder(llm) if steps is not None else None  # only the timed run is wrapped
        if rec is not None:
            llm.step = rec.step  # type: ignore[method-assign]
        turns, _ = run_bundled(llm, wl)
        if rec is not None and steps is not None:
            steps.extend(rec.rows)
        return turns, llm.stats()


def _engine_tiers(chain: tuple[PlannedTier, ...], directory: str) -> list[dict[str, Any]]:
    """The engine's ``tiers`` config for a chain ``plan`` prices (a disk's file in ``directory``)."""
    out: list[dict[str, Any]] = []
    for t in chain:
        tier: dict[str, Any] = {"name": t.medium, "medium": t.medium, "capacity": f"{t.size_bytes}B",
                                "eviction_policy": t.policy}
        if t.write_through:
            tier["write_through"] = True
        if t.medium == "disk":
            tier["path"] = directory
        out.append(tier)
    return out


def _cached(turns: list[tuple[str, int, Any]]) -> float:
    """Prompt tokens found cached (device and tiers) when each request was first admitted."""
    return float(sum(c.cached_tokens or 0 for _, _, c in turns))


def _p50_returning(turns: list[tuple[str, int, Any]]) -> float:
    vals = [c.ttft for _, t, c in turns if t > 0 and c.ttft is not None]
    return statistics.median(vals) if vals else 0.0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("plan", __doc__)
    p.add_argument("--profile", default=None,
                   help="tier speeds YAML (default: measure this machine's tiers now); the engine's speed is always "
                        "fitted on the steps of the run without offload, as an operator's current server gives it")
    p.add_argument("--conversations", type=int, default=8, help="chat workload: conversations")
    p.add_argument("--context", type=int, default=768, help="chat workload: each conversation's opening tokens")
    p.add_argument("--weka", default=None, help="WEKA traces .tar.gz: also validate on a slice of it")
    p.add_argument("--device-fraction", type=float, default=0.25, help="device cache as a share of the working set")
    p.add_argument("--max-batched-tokens", type=int, default=512, help="the engine's step budget")
    add_reps(p, 1)
    args = p.parse_args(argv)
    import torch

    from kvoffload.bench.profile_bench import fit_steps
    from kvoffload.plan.log_reader import read_log
    from kvoffload.plan.model_shape import kv_shape
    from kvoffload.plan.planner import make_plan
    from kvoffload.plan.profile import Profile, load_profile
    from kvoffload.plan.tier_spec import chain_label, parse_chain

    torch.set_num_threads(1)
    print(preamble(args.reps))
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile is None:
            from kvoffload.bench.profile_bench import measure_tier

            speeds = {m: measure_tier(m, "tiny", BLOCK, args.max_batched_tokens, 3, tmp) for m in ("cpu", "disk")}
        else:
            speeds = load_profile(args.profile).tiers
        block_bytes = kv_shape("tiny").bytes_per_token * BLOCK
        ratios: dict[tuple[str, str, str], list[float]] = {}

        def note(workload: str, config: str, figure: str, predicted: float, measured: float) -> str:
            ratio = predicted / measured if measured else 1.0 if predicted == 0 else math.inf
            ratios.setdefault((workload, config, figure), []).append(ratio)
            return f"{figure} {measured:,.1f} vs {predicted:,.1f} ({ratio:.2f})"

        for name, wl in _workloads(args).items():
            ws_blocks = math.ceil(wl.working_set_tokens / BLOCK)
            device = max(math.ceil(args.device_fraction * ws_blocks), wl.max_context // BLOCK + 2)
            big, small = ws_blocks * 2 * block_bytes, max(ws_blocks // 4, 64) * block_bytes
            chains = {"cpu": parse_chain(f"cpu:{big}B"), "cpu+disk": parse_chain(f"cpu:{small}B+disk:{big}B")}
            print(f"\n{name}: {len(wl.sessions)} sessions, working set {ws_blocks} blocks, device {device} blocks; "
                  + " and ".join(f"{chain_label(c)} ({k})" for k, c in chains.items())
                  + "; measured vs predicted (ratio)")
            for rep in range(args.reps):
                steps: list[tuple[dict[str, float], float]] = []
                base_turns, _ = _run(wl, None, device, args.max_batched_tokens, steps)
                profile = Profile(fit_steps(steps, args.max_batched_tokens, "tiny"), speeds, "fitted now")
                log = Path(tmp) / f"{name}-{rep}.jsonl"
                write_served_log(wl, base_turns, log)
                rlog = read_log(log, BLOCK, vocab=258, output_tokens=wl.max_tokens)
                plan = make_plan(rlog, list(chains.values()), block_bytes, device, profile, wl.max_tokens)
                first = plan.results[0]
                print(f"  rep {rep + 1} no offload: " + "; ".join([
                    note(name, "none", "returning TTFT p50 ms", first.base_ttft_p50_s * 1e3,
                         _p50_returning(base_turns) * 1e3),
                    note(name, "none", "prompt tokens cached", first.device_tokens, _cached(base_turns))]))
                for (config, chain), res in zip(chains.items(), plan.results):
                    # A fresh directory each run: a disk tier keeps its records across restarts.
                    tiers = _engine_tiers(chain, f"{tmp}/{name}-{rep}-{config}")
                    turns, stats = _run(wl, tiers, device, args.max_batched_tokens)
                    seen = stats["connector"]["load_cost"]["kvoffload_tier_load_bytes_per_second"]
                    parts = [note(name, config, "returning TTFT p50 ms", res.ttft_p50_s * 1e3,
                                  _p50_returning(turns) * 1e3),
                             note(name, config, "prompt tokens cached", res.device_tokens + res.prefill_tokens_saved,
                                  _cached(turns))]
                    parts += [note(name, config, f"{t.medium} tokens", t.tokens_served,
                                   stats["prefix_hit_tokens"].get(t.medium, 0)) for t in res.tiers]
                    print(f"  rep {rep + 1} {config}: " + "; ".join(parts)
                          + (f" [{stats['preemptions']} preemptions]" if stats["preemptions"] else "")
                          + "; loads seen " + ", ".join(f"{m} {bw / 1e9:.2f} GB/s" for m, bw in seen.items()))
        print("\nsummary, predicted / measured (median ± half-range of the reps):")
        for (workload, config, figure), values in ratios.items():
            print(f"  {workload:<5} {config:<9} {figure:<22} {Sample(tuple(values)).fmt()}x")
    return 0
