"""Returning chat turns batched with fresh long prompts, offline on vLLM in this Python (one
``LLM.generate`` call a round): each turn's first-token latency as vLLM measures it.

It needs vLLM: run it with the Python of a vLLM environment (``kvoffload bench mix`` there).

A 12-layer Llama shape with dummy weights, a device cache of 40 blocks of 128 tokens, steps of
at most 1,024 tokens; round 0 opens six chats on 640 tokens, each of 4 rounds then sends each
chat's next turn (64 tokens more) and three fresh 1,024-token prompts, the group ``--first``
submitted first. Each configuration runs in a process of its own, in turn, ``--reps`` times::

    .ci-vllm-venv/bin/python -m kvoffload bench mix --first turns --reps 3

prints each run's returning-turn p50 and p95, and per configuration the median ± half-range of
the run-by-run ratios against ``cpu:async`` and plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from kvoffload.bench.measure import Sample, bench_parser
from kvoffload.bench.serve_bench import rotation

CPU = "1GiB"


def _child(config: str, first: str, work: Path) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from kvoffload.bench.dummy_model import write_model
    from kvoffload.bench.serve_configs import configurations
    from kvoffload.bench.serve_workloads import mix

    wl = mix(first=first)
    write_model(work / "model", 12, 512, 8, 4, 32000)
    kv = configurations([config], CPU, "1GiB", work)[config]
    llm = LLM(model=str(work / "model"), load_format="dummy", dtype="float32", max_model_len=1152,
              num_gpu_blocks_override=40, max_num_batched_tokens=1024, max_num_seqs=16, enforce_eager=True,
              skip_tokenizer_init=True, gpu_memory_utilization=0.1, seed=0, disable_log_stats=False,
              kv_transfer_config=KVTransferConfig(**kv) if kv else None)
    params = SamplingParams(max_tokens=wl.max_tokens, ignore_eos=True, temperature=0)
    chats = [s for s in wl.sessions if not s.sid.startswith("f")]
    history = [list(s.prefix) for s in chats]
    ttfts: list[float] = []
    for rnd in range(wl.rounds):
        turns = [s.prompt(rnd, h) for s, h in zip(chats, history)]
        fresh = [list(s.turns[0]) for s in wl.sessions if s.sid.startswith("f") and s.round == rnd]
        prompts = turns + fresh if first == "turns" else fresh + turns
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        by_prompt = outs[:len(turns)] if first == "turns" else outs[len(fresh):]
        for i, out in enumerate(by_prompt):
            history[i] = turns[i] + list(out.outputs[0].token_ids)
            if rnd:
                ttfts.append(out.metrics.first_token_latency)
    ttfts.sort()
    print("RESULT " + json.dumps({"p50": statistics.median(ttfts), "p95": ttfts[int(0.95 * (len(ttfts) - 1))]}))


def _one(config: str, first: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-m", "kvoffload.bench.mix_bench", "--child", config, "--first", first,
                              "--work", tmp],
                             capture_output=True, text=True, check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{config} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def _fmt(ratios: Sample) -> str:
    return f"{ratios.fmt()}x ({', '.join(f'{v:.2f}' for v in ratios.values)})"


def main(argv: list[str] | None = None) -> None:
    p = bench_parser("mix", __doc__)
    p.add_argument("--first", choices=["turns", "fresh"], default="turns",
                   help="which group each round submits first: the returning turns or the fresh prompts")
    p.add_argument("--configs", default="plain,cpu:async,cpu", help="configurations, as bench serve's --configs")
    p.add_argument("--reps", type=int, default=3, help="runs of each configuration (rotating order)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, args.first, Path(args.work))
        return
    names = args.configs.split(",")
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in rotation(names, rep):
            runs[name].append(_one(name, args.first))
            r = runs[name][-1]
            print(f"rep {rep} {name:<10} returning-turn TTFT p50 {r['p50'] * 1e3:7.0f} ms  p95 {r['p95'] * 1e3:7.0f} ms",
                  flush=True)
    for base in ("cpu:async", "plain"):
        if base not in runs:
            continue
        for name in names:
            if name == base:
                continue
            for q in ("p50", "p95"):
                ratios = Sample(tuple(b[q] for b in runs[base])).ratio(Sample(tuple(r[q] for r in runs[name])))
                print(f"{name} vs {base}, returning-turn {q}: {_fmt(ratios)}")


if __name__ == "__main__":
    main()
