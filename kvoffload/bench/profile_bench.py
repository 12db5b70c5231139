"""``kvoffload bench profile``: the speeds `kvoffload plan` prices a plan with, measured on this
machine by the real engine and tiers, written as the profile YAML.

- Prefill: the bundled engine computes prompts of several lengths with nothing cached; the
  median time of each is fitted by steps x step_s + tokens x token_s + tokens^2/2 x attention_s
  (least squares, no negative term). Decoding: steps of 1 and of 8 requests give what each
  decoding request adds to a step (decode_s).
- Tiers: each prompt is computed once more after the device cache is dropped, so its blocks
  load from the tier; the load speed and per-job latency are what the connector's own cost model
  fitted from those copies (kvoffload_tier_load_bytes_per_second and _latency_seconds). A disk
  run writes every block through to the disk and pushes it out of a small host tier with
  another prompt before the reload, so the loads come from the disk. Store speed: the
  device-to-host copies of the run (the disk's own writes are demotions beside the steps,
  not timed per tier; its store speed is taken as its load speed).
The baseline this prints beside each tier is a plain contiguous copy of the same bytes.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import random
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from kvoffload.bench.measure import add_reps, bench_parser, preamble
from kvoffload.plan.profile import EngineSpeed, Profile, TierSpeed

LENGTHS = (16, 64, 256, 512, 1024, 2048)
DECODE_BATCH = 8
DECODE_CONTEXT = 256
DECODE_STEPS = 32


def _engine(model: str, block_size: int, mbt: int, kv_offload: Any, device_blocks: int) -> Any:
    from kvoffload.engine import LLM, EngineConfig

    return LLM(EngineConfig(model=model, block_size=block_size, num_gpu_blocks=device_blocks, max_model_len=4096,
                            max_num_batched_tokens=mbt, kv_offload=kv_offload))


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 250) for _ in range(n)]


def fit_prefill(samples: list[tuple[int, int, float]], mbt: int, model: str) -> EngineSpeed:
    """(tokens, steps, seconds) -> the least-squares speeds, a term that fits negative dropped."""
    names = ["step_s", "token_s", "attention_s"]
    cols = {"step_s": [s for _, s, _ in samples], "token_s": [n for n, _, _ in samples],
            "attention_s": [n * n / 2 for n, _, _ in samples]}
    y = np.array([t for _, _, t in samples])
    keep = list(names)
    while True:
        a = np.array([cols[k] for k in keep], dtype=float).T
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    got = dict(zip(keep, np.maximum(coef, 0.0)))
    return EngineSpeed(model, float(got.get("step_s", 0.0)), float(got.get("token_s", 1e-9)) or 1e-9,
                       float(got.get("attention_s", 0.0)), mbt)


def measure_prefill(model: str, block_size: int, mbt: int, reps: int) -> EngineSpeed:
    import math

    from kvoffload.engine.sampling_params import SamplingParams

    rng = random.Random(0)
    device = max(max(LENGTHS), DECODE_BATCH * (DECODE_CONTEXT + DECODE_STEPS + 16)) // block_size + 8
    llm = _engine(model, block_size, mbt, None, device)
    try:
        llm.generate([_prompt(rng, 64)], SamplingParams(max_tokens=1))  # warm-up
        samples = []
        for n in LENGTHS:
            times = []
            for _ in range(reps):
                llm.reset_prefix_cache()
                t0 = time.perf_counter()
                llm.generate([_prompt(rng, n)], SamplingParams(max_tokens=1))
                times.append(time.perf_counter() - t0)
            samples.append((n, math.ceil(n / mbt), statistics.median(times)))
        # Decode steps of one and of DECODE_BATCH requests: a step's own cost and what each
        # decoding request adds (its token and its attention over a mid-sized context).
        per_step = {}
        for batch in (1, DECODE_BATCH):
            times = []
            for _ in range(reps):
                ps = [_prompt(rng, DECODE_CONTEXT) for _ in range(batch)]
                llm.reset_prefix_cache()
                t0 = time.perf_counter()
                llm.generate(ps, SamplingParams(max_tokens=1))
                one = time.perf_counter() - t0
                llm.reset_prefix_cache()
                t0 = time.perf_counter()
                llm.generate(ps, SamplingParams(max_tokens=DECODE_STEPS + 1, ignore_eos=True))
                times.append((time.perf_counter() - t0 - one) / DECODE_STEPS)
            per_step[batch] = statistics.median(times)
    finally:
        llm.close()
    decode = max(0.0, (per_step[DECODE_BATCH] - per_step[1]) / (DECODE_BATCH - 1))
    samples += [(1, 1, max(per_step[1] - decode, 1e-6))] * len(LENGTHS)  # a step with one token
    return dataclasses.replace(fit_prefill(samples, mbt, model), decode_s=decode)


def measure_tier(medium: str, model: str, block_size: int, mbt: int, reps: int, directory: str) -> TierSpeed:
    from kvoffload.engine.sampling_params import SamplingParams
    from kvoffload.plan.model_shape import kv_shape

    block = kv_shape(model).bytes_per_token * block_size
    # With disk, a host tier a little over one step's stores: longer prompts' heads load from disk.
    host = "256MiB" if medium == "cpu" else f"{(mbt // block_size + 8) * block}B"
    tiers: list[dict[str, Any]] = [{"name": "cpu", "medium": "cpu", "capacity": host}]
    if medium == "disk":
        tiers.append({"name": "disk", "medium": "disk", "capacity": "256MiB", "path": directory, "write_through": True})
    elif medium != "cpu":
        raise ValueError(f"--tiers {medium}: bench profile measures cpu and disk; give other tiers' speeds in the YAML")
    rng = random.Random(1)
    device = max(LENGTHS) // block_size + 8
    llm = _engine(model, block_size, mbt, {"tiers": tiers, "load_mode": "async"}, device)
    try:
        for n in LENGTHS * reps:
            p = _prompt(rng, n)
            llm.generate([p], SamplingParams(max_tokens=1))
            if medium != "cpu":  # push the prompt out of the host tier: its blocks wait on disk
                llm.generate([_prompt(rng, max(LENGTHS))], SamplingParams(max_tokens=1))
            llm.reset_prefix_cache()
            llm.generate([p], SamplingParams(max_tokens=1))
            llm.reset_prefix_cache()
        stats = llm.stats()
    finally:
        llm.close()
    cost = stats["connector"]["load_cost"]
    bw = cost["kvoffload_tier_load_bytes_per_second"].get(medium)
    if not bw:
        raise RuntimeError(f"tier {medium}: no load was timed (hits {stats['prefix_hit_tokens']}); nothing to profile")
    lat = cost["kvoffload_tier_load_latency_seconds"].get(medium, 0.0)
    d2h = stats["transfer"].get("device_to_host", {})
    store = d2h.get("gb_per_s") or bw / 1e9
    if medium != "cpu":
        store = bw / 1e9
    return TierSpeed(bw / 1e9, float(store), float(lat), float(lat))


def _plain_copy_gbps(nbytes: int = 64 << 20) -> float:
    a = np.ones(nbytes, dtype=np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    t0 = time.perf_counter()
    np.copyto(b, a)
    return nbytes / (time.perf_counter() - t0) / 1e9


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("profile", __doc__)
    p.add_argument("--out", default="kvoffload_profile.yaml", help="where the profile goes")
    p.add_argument("--model", default="tiny", help="the bundled engine's model whose prefill is timed")
    p.add_argument("--tiers", default="cpu,disk", help="comma-separated media to time (cpu, disk)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per engine block")
    p.add_argument("--max-batched-tokens", type=int, default=512, help="the engine's step budget")
    p.add_argument("--dir", default=None, help="directory for the disk tier's file (default: a temporary one)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    add_reps(p, 3)
    args = p.parse_args(argv)
    if args.block_size < 1 or args.max_batched_tokens < 1:
        raise ValueError(f"--block-size {args.block_size}, --max-batched-tokens {args.max_batched_tokens}: "
                         "each must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    print(preamble(args.reps))
    engine = measure_prefill(args.model, args.block_size, args.max_batched_tokens, args.reps)
    print(f"prefill ({args.model}): step {engine.step_s * 1e3:.3f} ms + {engine.token_s * 1e6:.2f} us/token + "
          f"{engine.attention_s * 1e9:.3f} ns/token^2 ({args.max_batched_tokens} tokens a step); decoding: "
          f"{engine.decode_s * 1e3:.3f} ms a request a step")
    speeds = {}
    plain = _plain_copy_gbps()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for medium in [m.strip() for m in args.tiers.split(",") if m.strip()]:
            s = measure_tier(medium, args.model, args.block_size, args.max_batched_tokens, args.reps, tmp)
            speeds[medium] = s
            print(f"{medium}: loads {s.load_gb_per_s:.3f} GB/s + {s.load_latency_s * 1e6:.0f} us a job, stores "
                  f"{s.store_gb_per_s:.3f} GB/s; plain memory copy {plain:.2f} GB/s, ratio "
                  f"{s.load_gb_per_s / plain:.3f}")
    machine = f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    Profile(engine, speeds, machine).save(args.out)
    print(f"profile written: {args.out}")
    return 0
