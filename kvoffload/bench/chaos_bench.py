"""kvoffload bench chaos: many random configurations and fault plans against the reference.

Not a speed figure: it prints how many cases ran, how many failed, and for each failure its
seed and configuration (``--seed S --cases 1`` reruns exactly that case).
"""

from __future__ import annotations

import logging
import resource
import time

import torch

from kvoffload.bench.measure import bench_parser
from kvoffload.testing.chaos import describe, draw_case, run_case


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("chaos", __doc__)
    parser.add_argument("--cases", type=int, default=100, help="how many cases to run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first case; case i uses seed + i")
    parser.add_argument("--verbose", action="store_true", help="show the warnings the faults provoke")
    parser.add_argument("--engine", choices=["bundled", "vllm"], default="bundled",
                        help="bundled: random configurations in-process (default); vllm: HTTP chaos against a real "
                             "vllm serve (client aborts, n=2, cache resets, corrupted disk records, both failure "
                             "policies); needs vLLM installed")
    parser.add_argument("--model", default=None, help="vllm: a checkpoint directory (default: a tiny random Llama)")
    parser.add_argument("--duration", type=float, default=60.0, help="vllm: seconds of traffic per configuration")
    parser.add_argument("--clients", type=int, default=64, help="vllm: concurrent streaming clients")
    args = parser.parse_args(argv)
    if args.engine == "vllm":
        if args.duration <= 0 or args.clients < 1:
            parser.error(f"--duration {args.duration} / --clients {args.clients}: must be positive")
        return _vllm_chaos(args.model, args.duration, args.clients, args.seed)
    if args.cases < 1:
        parser.error(f"--cases {args.cases}: must be >= 1")
    torch.set_num_threads(1)
    if not args.verbose:
        logging.getLogger("kvoffload").setLevel(logging.ERROR)
    reference: dict = {}
    failures = []
    t0 = time.perf_counter()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    from tqdm import tqdm

    with tqdm(total=args.cases, desc="cases", unit="case", disable=None) as bar:
        for i in range(args.cases):
            result = run_case(draw_case(args.seed + i), reference)
            if not result.ok:
                failures.append(result)
                tqdm.write(f"FAIL seed={result.case.seed}: {result.error.splitlines()[0]}\n     {describe(result.case)}")
            bar.update(1)
            bar.set_postfix(failed=len(failures))
    elapsed = time.perf_counter() - t0
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"chaos: {args.cases} cases, {len(failures)} failed, {elapsed:.0f} s, peak RSS +{rss:.0f} MiB")
    if failures:
        print("failing seeds: " + " ".join(str(r.case.seed) for r in failures))
    return 1 if failures else 0


def _vllm_chaos(model: str | None, duration: float, clients: int, seed: int) -> int:
    import tempfile
    from pathlib import Path

    from kvoffload.testing.vllm_chaos import ChaosConfig, configurations, reference_outputs, run_chaos

    with tempfile.TemporaryDirectory(prefix="kvoffload-chaos-") as tmp:
        work = Path(tmp)
        if model is None:
            model = str(work / "tiny-llama")
            make_tiny_llama(model)
        cfg = ChaosConfig(model=model, duration_s=duration, clients=clients, seed=seed)
        print(f"vllm chaos: plain vLLM reference outputs for {model} ...", flush=True)
        ref = reference_outputs(cfg, work)
        reports = []
        for name, tiers, policy, disk in configurations(work):
            print(f"vllm chaos: {name}, {clients} clients for {duration:.0f} s ...", flush=True)
            report = run_chaos(cfg, name, tiers, policy, work, ref, disk)
            print(report.line(), flush=True)
            for problem in (report.errors + report.mismatches)[:5]:
                print(f"     {problem.splitlines()[0][:300]}")
            reports.append(report)
    return 0 if all(r.ok for r in reports) else 1


def make_tiny_llama(path: str) -> None:
    """A 2-layer random Llama with transformers (nothing downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048)
    LlamaForCausalLM(cfg).save_pretrained(path)
