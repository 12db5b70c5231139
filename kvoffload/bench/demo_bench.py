"""`kvoffload run`'s own workload with and without its CPU tier (load_mode auto), per model:
does the default ever make the engine slower than running without offload?

The bar is the one the demo promises: with offload, TTFT p50 and p95 at most 1.03x and tokens/s
at least 0.97x those without it, on the medians of interleaved runs. The engine settings,
workload and config are `kvoffload run`'s defaults, read from where that command defines them.
"""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble
from kvoffload.engine import LLM, EngineConfig
from kvoffload.examples import resolve_config
from kvoffload.report import percentile
from kvoffload.run_command import ENGINE, OFFLOAD, WORKLOAD
from kvoffload.workload import run_chat_workload

#: Offload over no offload: at most this for TTFT, at least TOKENS_BAR for tokens/s.
TTFT_BAR, TOKENS_BAR = 1.03, 0.97
METRICS = ("TTFT p50 (ms)", "TTFT p95 (ms)", "tokens/s")


def run_once(model: str, offload: str | None) -> tuple[list[list[int]], dict[str, float]]:
    with LLM(EngineConfig(model=model, kv_offload=offload, **ENGINE)) as llm:  # type: ignore[arg-type]
        t0 = time.perf_counter()
        tokens = run_chat_workload(llm, WORKLOAD)
        wall = time.perf_counter() - t0
        stats = llm.stats()
    return tokens, {"TTFT p50 (ms)": 1000 * percentile(stats["ttft_s"], 0.5),
                    "TTFT p95 (ms)": 1000 * percentile(stats["ttft_s"], 0.95),
                    "tokens/s": (stats["prompt_tokens"] + stats["generated_tokens"]) / wall}


def verdict(base: dict[str, Sample], off: dict[str, Sample]) -> tuple[bool, str]:
    """Whether offload met the bar on the medians, and the three ratios that say so."""
    ratios = {m: off[m].ratio(base[m]).median for m in METRICS}  # run by run: each pair shares conditions
    ok = ratios["TTFT p50 (ms)"] <= TTFT_BAR and ratios["TTFT p95 (ms)"] <= TTFT_BAR and ratios["tokens/s"] >= TOKENS_BAR
    text = ", ".join(f"{m.split(' (')[0]} {r:.2f}x" for m, r in ratios.items())
    return ok, text


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("demo", __doc__)
    parser.add_argument("--models", default="small,tiny", help="comma-separated models, each measured on its own")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (kvoffload run's default)")
    add_reps(parser, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    print(f"kvoffload run's workload: {WORKLOAD.conversations} chats x {WORKLOAD.turns} turns, device cache "
          f"{ENGINE['num_gpu_blocks']} blocks; models {', '.join(models)}; {preamble(args.reps)}")
    print(f"the bar (offload / none, on the medians): TTFT p50 and p95 <= {TTFT_BAR}x, tokens/s >= {TOKENS_BAR}x")
    failed = []
    for model in models:
        runs: dict[str, dict[str, list[float]]] = {"none": {m: [] for m in METRICS}, "auto": {m: [] for m in METRICS}}
        identical = True
        run_once(model, None)  # warm-up: the first engine of a process pays for imports and allocator growth
        for _ in tqdm(range(args.reps), desc=f"{model}: runs (no offload, then offload)", unit="rep", disable=None):
            base_tokens, base = run_once(model, None)
            off_tokens, off = run_once(model, resolve_config(OFFLOAD))
            identical = identical and base_tokens == off_tokens
            for side, figures in (("none", base), ("auto", off)):
                for m in METRICS:
                    runs[side][m].append(figures[m])
        base_s = {m: Sample(tuple(v)) for m, v in runs["none"].items()}
        off_s = {m: Sample(tuple(v)) for m, v in runs["auto"].items()}
        print(f"\nmodel={model}")
        print(f"{'':<16}{'no offload':>18}{'offload (auto)':>18}{'ratio':>14}{'lowest-highest':>18}")
        for m in METRICS:
            r = off_s[m].ratio(base_s[m])
            print(f"{m:<16}{base_s[m].fmt('.1f'):>18}{off_s[m].fmt('.1f'):>18}{r.median:>13.2f}x"
                  f"{f'{min(r.values):.2f}-{max(r.values):.2f}x':>18}")
        ok, text = verdict(base_s, off_s)
        print(f"{model}: offload {'meets' if ok else 'MISSES'} the bar ({text}); outputs identical: "
              f"{'yes' if identical else 'NO'}")
        if not (ok and identical):
            failed.append(model)
    if failed:
        print(f"\nmissed the bar: {', '.join(failed)}")
    return 1 if failed else 0
