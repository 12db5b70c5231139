"""``kvoffload bench profile``: the speeds `kvoffload plan` prices a plan with, measured on this
machine by the real engine and tiers, written as the profile YAML.

- The engine: prompts of 16 to 2,048 tokens alone, then a mixed load (four at a time, each
  decoding 24 tokens and returning once with 64 tokens more), every step timed and what it
  computed noted; least squares over the steps fit
  a step's own cost, each prefill token, their attention (new x earlier tokens), each decoding
  request and its context (no negative term).
- Tiers: each prompt is computed once more after the device cache is dropped, so its blocks
  load from the tier; the load speed and per-job latency are what the connector's own cost model
  fitted from those copies (kvoffload_tier_load_bytes_per_second and _latency_seconds). A disk (or
  fs) run writes every block through to it and pushes it out of a small host tier with another
  prompt before the reload, so the loads come from there. Store speed: the
  device-to-host copies of the run (the disk's own writes are demotions beside the steps,
  not timed per tier; its store speed is taken as its load speed).
The baseline this prints beside each tier is a plain contiguous copy of the same bytes.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import random
import tempfile
import time
from typing import Any

import numpy as np

from kvoffload.bench.measure import add_reps, bench_parser, preamble
from kvoffload.bench.step_fit import LENGTHS, fit_steps, step_terms
from kvoffload.engine.request import RequestStatus
from kvoffload.plan.model_shape import kv_shape
from kvoffload.plan.profile import EngineSpeed, Profile, TierSpeed


def _engine(model: str, block_size: int, mbt: int, kv_offload: Any, device_blocks: int) -> Any:
    from kvoffload.engine import LLM, EngineConfig

    return LLM(EngineConfig(model=model, block_size=block_size, num_gpu_blocks=device_blocks, max_model_len=4096,
                            max_num_batched_tokens=mbt, max_num_seqs=16, kv_offload=kv_offload))


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 250) for _ in range(n)]


class StepRecorder:
    """Wraps an engine's model runner (a measuring wrapper, in the benchmarks only) to note what
    each step computed (per request: its new tokens, what it had computed, whether it decodes),
    and times its steps: ``rows`` collects (step terms, seconds) per step run by ``step``."""

    def __init__(self, llm: Any) -> None:
        self.inner = llm.runner.execute_model
        self.plain_step = llm.step
        self.prompt_len: dict[str, int] = {}
        self.current: list[tuple[int, int, bool]] = []
        self.rows: list[tuple[dict[str, float], float]] = []
        self.busy = llm.scheduler.has_unfinished_requests
        self.requests = llm.scheduler.requests
        self.loading: set[str] = set()
        self.loads = 0
        self.last_end: float | None = None
        llm.runner.execute_model = self

    def __call__(self, so: Any) -> Any:
        computed = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
        for r in so.scheduled_new_reqs:
            self.prompt_len[r.req_id] = r.num_prompt_tokens if r.num_prompt_tokens >= 0 else len(r.prompt_token_ids)
        cached = so.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        self.current = [(n, computed[rid], computed[rid] >= self.prompt_len.get(rid, 0))
                        for rid, n in so.num_scheduled_tokens.items() if n > 0]
        # Loads sent off this step (requests now waiting for them) and taken back (scheduled again).
        loading = {rid for rid, r in self.requests.items() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS}
        self.loads = len(loading - self.loading) + sum(1 for rid in so.num_scheduled_tokens if rid in self.loading)
        self.loading = loading
        return self.inner(so)

    def step(self) -> list[str]:
        """One engine step, timed and noted: from the previous step's end where the engine had
        work left then (what its caller did between the two is part of the step's cadence, as a
        server's loop is), else from its own start."""
        t0 = time.perf_counter()
        done = self.plain_step()
        end = time.perf_counter()
        start = self.last_end if self.last_end is not None else t0
        self.rows.append((step_terms(self.current, self.loads), end - start))
        self.last_end = end if self.busy() else None
        return done


def measure_prefill(model: str, block_size: int, mbt: int, reps: int) -> EngineSpeed:
    """The engine's step time, every step timed with what it computed: prompts of every length
    alone (prefill only), then a mixed load: prompts arriving four at a time, each decoding 24
    tokens and returning once with 64 tokens more (a prefix hit: short prefills over long
    contexts)."""
    from kvoffload.engine.sampling_params import SamplingParams

    rng = random.Random(0)
    llm = _engine(model, block_size, mbt, None, 8 * (max(LENGTHS) + 128) // block_size + 8)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    try:
        llm.generate([_prompt(rng, 64)], SamplingParams(max_tokens=2))  # warm-up
        rec = StepRecorder(llm)
        for n in LENGTHS * reps:  # prefill alone: what pins a step's own cost apart from decoding's
            llm.add_request(_prompt(rng, n), SamplingParams(max_tokens=1))
            while not (done := rec.step()):
                pass
            llm.collect(done[0])
        queue = [_prompt(rng, n) for n in LENGTHS * reps]
        rng.shuffle(queue)
        running: dict[str, tuple[list[int], bool]] = {}
        while queue or running:
            while queue and len(running) < 4:
                prompt = queue.pop()
                running[llm.add_request(prompt, params)] = (prompt, len(prompt) in LENGTHS)
            for rid in rec.step():
                out = llm.collect(rid)
                prompt, fresh = running.pop(rid)
                if fresh:  # it returns, its answer and 64 new tokens after its prompt
                    queue.insert(0, prompt + list(out.token_ids) + _prompt(rng, 64))
    finally:
        llm.close()
    return fit_steps(rec.rows, mbt, model)


def measure_tier(medium: str, model: str, block_size: int, mbt: int, reps: int, directory: str,
                 steps: list[tuple[dict[str, float], float]] | None = None) -> TierSpeed:
    """A tier's loads and stores as its cost model and copies timed them; ``steps``: the run's
    steps (terms, seconds) go there too."""
    from kvoffload.bench.serve_bundled import reset_cold
    from kvoffload.engine.sampling_params import SamplingParams
    from kvoffload.plan.model_shape import kv_shape

    block = kv_shape(model).bytes_per_token * block_size
    # With disk, a host tier a little over one step's stores: longer prompts' heads load from disk.
    host = "256MiB" if medium == "cpu" else f"{(mbt // block_size + 8) * block}B"
    tiers: list[dict[str, Any]] = [{"name": "cpu", "medium": "cpu", "capacity": host}]
    if medium in ("disk", "fs"):
        tiers.append({"name": medium, "medium": medium, "capacity": "256MiB", "path": os.path.join(directory, medium),
                      "write_through": True})
    elif medium != "cpu":
        raise ValueError(f"--tiers {medium}: bench profile measures cpu, disk and fs; give other tiers' speeds "
                         "(mooncake's) in the YAML by hand")
    rng = random.Random(1)
    device = max(LENGTHS) // block_size + 8
    llm = _engine(model, block_size, mbt, {"tiers": tiers, "load_mode": "async"}, device)
    if steps is not None:
        rec = StepRecorder(llm)
        llm.step = rec.step
        steps_of = rec.rows
    try:
        for n in LENGTHS * reps:
            p = _prompt(rng, n)
            llm.generate([p], SamplingParams(max_tokens=1))
            if medium != "cpu":  # push the prompt out of the host tier: its blocks wait on disk
                llm.generate([_prompt(rng, max(LENGTHS))], SamplingParams(max_tokens=1))
            reset_cold(llm, medium, reset_connector=False)  # the device forgets; the tiers keep it
            llm.generate([p], SamplingParams(max_tokens=1))
            reset_cold(llm, medium, reset_connector=False)
        stats = llm.stats()
    finally:
        llm.close()
    if steps is not None:
        steps.extend(steps_of)
    cost = stats["connector"]["load_cost"]
    bw = cost["kvoffload_tier_load_bytes_per_second"].get(medium)
    if not bw:
        raise RuntimeError(f"tier {medium}: no load was timed (hits {stats['prefix_hit_tokens']}); nothing to profile")
    lat = cost["kvoffload_tier_load_latency_seconds"].get(medium, 0.0)
    # Stores: the host tier's are the run's device-to-host copies; a lower tier's are demotions
    # beside the steps, not timed per tier, so its load speed stands in.
    store = (stats["transfer"].get("device_to_host", {}).get("gb_per_s") if medium == "cpu" else None) or bw / 1e9
    return TierSpeed(bw / 1e9, float(store), float(lat), float(lat))


def load_overheads(steps: list[tuple[dict[str, float], float]]) -> tuple[float, float]:
    """(idle_step_s, load_step_s) from steps that computed nothing: those that only waited for a
    load, and those that sent loads off (less an idle step, per load)."""
    idle = [t for terms, t in steps if not terms["token_s"] and not terms["decode_s"] and not terms["load_step_s"]]
    sent = [t / terms["load_step_s"] for terms, t in steps
            if not terms["token_s"] and not terms["decode_s"] and terms["load_step_s"]]
    idle_s = float(np.median(idle)) if idle else 0.0
    return idle_s, max(float(np.median(sent)) - idle_s, 0.0) if sent else 0.0


def _vllm_engine(args: Any) -> EngineSpeed:
    """vLLM's steps timed offline with the server's settings; its OpenMP threads are the server's
    engine's (one a core it binds: ``--threads``), not every core, which vLLM takes in one process."""
    from pathlib import Path

    from kvoffload.bench.vllm_steps import vllm_engine_speed
    from kvoffload.plan.model_shape import kv_shape

    config = Path(args.model) / "config.json"
    if not config.is_file():
        raise ValueError(f"--model {args.model}: --engine vllm needs a checkpoint directory with a config.json")
    vocab = kv_shape(args.model).vocab_size or 32000  # the config's own (a text_config's, for a multimodal one)
    settings = {"max_num_batched_tokens": args.max_batched_tokens, "max_model_len": args.max_model_len,
                "dtype": args.dtype, "gpu_memory_utilization": 0.3}
    if not any(any(Path(args.model).glob(f"*.{ext}")) for ext in ("safetensors", "bin", "pt")):
        # A config.json alone (bench serve --write-log keeps one): random weights cost the same compute.
        print(f"--model {args.model}: no weight files there; timing its shape with random weights (load_format dummy)")
        settings["load_format"] = "dummy"
    return vllm_engine_speed(args.model, settings, args.reps, min(vocab, 32000), {"OMP_NUM_THREADS": str(args.threads)})


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
    p.add_argument("--engine", choices=["bundled", "vllm"], default="bundled",
                   help="vllm: time vLLM's own steps (offline, with this python's vLLM) on --model, a checkpoint "
                        "directory, with the server's --max-batched-tokens, --max-model-len, --dtype and --threads")
    p.add_argument("--model", default="tiny", help="the model whose prefill is timed (bundled: tiny, small; vllm: a "
                                                    "checkpoint directory)")
    p.add_argument("--max-model-len", type=int, default=4096, help="--engine vllm: the server's max_model_len")
    p.add_argument("--dtype", default="auto", help="--engine vllm: the server's dtype")
    p.add_argument("--tiers", default="cpu,disk,fs", help="comma-separated media to time (cpu, disk, fs)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per engine block")
    p.add_argument("--max-batched-tokens", type=int, default=None,
                   help="the engine's step budget (default 512; with --from, the largest step the server published)")
    p.add_argument("--dir", default=None, help="directory for the disk tier's file (default: a temporary one)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (--engine vllm: the OpenMP threads the server's engine binds)")
    p.add_argument("--from", dest="from_url", default=None, metavar="URL",
                   help="read the speeds a running server measured in service from its /metrics (the bundled "
                        "engine's or vllm serve's with kvoffload) instead of timing this machine; --model names "
                        "the model it serves")
    add_reps(p, 3)
    args = p.parse_args(argv)
    if args.max_batched_tokens is not None and args.max_batched_tokens < 1:
        raise ValueError(f"--max-batched-tokens {args.max_batched_tokens}: give at least 1")
    if args.from_url is not None:
        from kvoffload.bench.profile_scrape import profile_from_server

        timed = kv_shape(args.model)
        profile = profile_from_server(args.from_url, args.model, timed.signature, timed.params, args.max_batched_tokens)
        profile.save(args.out)
        print(f"profile from {args.from_url} (in service): engine a step {profile.engine.step_s * 1e3:.3f} ms + "
              f"{profile.engine.token_s * 1e6:.2f} us a token; tiers " + ", ".join(
                  f"{m} {t.load_gb_per_s:.3f} GB/s" for m, t in profile.tiers.items()) + f"; written: {args.out}")
        return 0
    args.max_batched_tokens = args.max_batched_tokens or 512
    if args.block_size < 1 or args.max_batched_tokens < 1:
        raise ValueError(f"--block-size {args.block_size}, --max-batched-tokens {args.max_batched_tokens}: "
                         "each must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    print(preamble(args.reps))
    if args.engine == "vllm":
        engine = _vllm_engine(args)
    else:
        engine = measure_prefill(args.model, args.block_size, args.max_batched_tokens, args.reps)
    print(f"engine ({args.model}): a step {engine.step_s * 1e3:.3f} ms + {engine.token_s * 1e6:.2f} us a prefill "
          f"token + {engine.attention_s * 1e9:.3f} ns a (new x earlier) token pair + {engine.decode_s * 1e3:.3f} ms a "
          f"decoding request + {engine.decode_context_s * 1e9:.1f} ns a token of its context "
          f"({args.max_batched_tokens} tokens a step)")
    speeds = {}
    plain = _plain_copy_gbps()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for medium in [m.strip() for m in args.tiers.split(",") if m.strip()]:
            # The tiers' copies are timed on the bundled engine: bytes a second, whatever the model.
            model = args.model if args.engine == "bundled" else "tiny"
            rows: list[tuple[dict[str, float], float]] = []
            s = measure_tier(medium, model, args.block_size, args.max_batched_tokens, args.reps, tmp, rows)
            speeds[medium] = s
            if medium == "cpu" and args.engine == "bundled":  # what a load costs the engine's steps
                idle, load = load_overheads(rows)
                engine = dataclasses.replace(engine, idle_step_s=idle, load_step_s=load)
                print(f"loads: an idle step {idle * 1e3:.3f} ms, a load sent or taken back {load * 1e3:.3f} ms")
            print(f"{medium}: loads {s.load_gb_per_s:.3f} GB/s + {s.load_latency_s * 1e6:.0f} us a job, stores "
                  f"{s.store_gb_per_s:.3f} GB/s; plain memory copy {plain:.2f} GB/s, ratio "
                  f"{s.load_gb_per_s / plain:.3f}")
    machine = f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    timed = kv_shape(args.model)  # the profile says which model it timed: a plan for another refuses it
    Profile(dataclasses.replace(engine, shape=timed.signature, params=timed.params), speeds, machine).save(args.out)
    print(f"profile written: {args.out}")
    return 0
