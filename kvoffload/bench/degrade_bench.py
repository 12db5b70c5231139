"""kvoffload bench degrade: a disk tier that slows down after ``auto`` timed it fast, against
recomputing everything (plain): time to first token of a burst of returning requests.

Contexts are stored and written through to a disk tier; a few hits are served from it while it
is fast (the load cost model times it); then the disk reads at ``--slow`` (a test wrapper,
``kvoffload.testing.throttle``) and ``--burst`` requests whose contexts are on disk arrive at
once. The figure is the burst's TTFT p50 (and its slowest request) with the tier, over plain's
in the same run: a tier that went slow should cost about nothing (its loads are given up or
never planned), where waiting for it would cost each request its slow load. The same requests
run one by one too (``--sequential``): the first hit after the slowdown pays one recompute's
time before its load is given up; the rest recompute outright.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kvoffload.bench.measure import Sample, add_reps, bench_parser, positive_int, preamble
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.testing.throttle import ThrottledOffloadingSpec, parse_throttles

#: Reads a warm-up hit takes: a 1 MiB piece at a time (the disk tier's load pieces).
_PIECE = 1 << 20


def _prompt(i: int, turn: int, context: int) -> list[int]:
    return [(i * 7919 + j * 31) % 31000 + 10 for j in range(context)] + [5 + turn] * 16


def _serve(llm: LLM, prompts: list[list[int]]) -> list[float]:
    """TTFT of each prompt, all submitted at once."""
    t0 = time.perf_counter()
    rids = [llm.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True)) for p in prompts]
    ttft: dict[str, float] = {}
    done: set[str] = set()
    while len(done) < len(rids):
        finished = llm.step()
        now = time.perf_counter() - t0
        for rid in rids:
            if rid not in ttft and llm.output_token_ids(rid):
                ttft[rid] = now
        for rid in finished:
            done.add(rid)
            llm.collect(rid)
    return [ttft[r] for r in rids]


def _drain(llm: LLM) -> None:
    connector = llm.scheduler_connector
    while connector is not None and connector.has_pending_work():
        llm.step()
        time.sleep(0.005)
    assert llm.reset_prefix_cache()


def run_once(model: Path, work: Path, offload: bool, args: Any) -> tuple[list[float], dict[str, Any]]:
    """One run: store, warm the tier, then the burst (or the same requests one by one)."""
    kv = None
    if offload:
        block_bytes = 16 * 16 * 1024  # 16 tokens x 16 KiB a token (the model below)
        blocks = -(-(args.context + 16) // 16)
        reads = args.warm * -(-(blocks * block_bytes) // _PIECE)
        ThrottledOffloadingSpec.throttles = parse_throttles(f"disk:{args.slow}:0ms:after={reads}")
        kv = {"tiers": [{"medium": "cpu", "capacity": args.cpu},
                        {"medium": "disk", "path": str(work / f"disk-{time.monotonic_ns()}"), "capacity": "4GiB",
                         "write_through": True, "max_store_ms_per_mib": 60000}],
              "spec_name": "ThrottledOffloadingSpec", "spec_module_path": "kvoffload.testing.throttle"}
    cfg = EngineConfig(model=str(model), load_format="dummy", dtype="float32", block_size=16, num_gpu_blocks=600,
                       max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=2048, kv_offload=kv)
    with LLM(cfg) as llm:
        n = args.warm + args.burst
        for i in range(n):
            _serve(llm, [_prompt(i, 0, args.context)])
        _drain(llm)
        for i in range(args.warm):  # hits from the disk while it is fast
            _serve(llm, [_prompt(i, 1, args.context)])
            _drain(llm)
        prompts = [_prompt(args.warm + k, 2, args.context) for k in range(args.burst)]
        ttft = [_serve(llm, [p])[0] for p in prompts] if args.sequential else _serve(llm, prompts)
        stats = dict(llm.stats().get("connector", {}))
    return ttft, stats


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("degrade", __doc__)
    p.add_argument("--context", type=positive_int, default=512, help="tokens of each stored context")
    p.add_argument("--warm", type=positive_int, default=6, help="hits served while the disk is fast")
    p.add_argument("--burst", type=positive_int, default=8, help="requests arriving together after the slowdown")
    p.add_argument("--slow", default="1MB/s", help="the disk's read speed after the warm-up")
    p.add_argument("--cpu", default="32MiB", help="the CPU tier (small: hits come from the disk)")
    p.add_argument("--sequential", action="store_true", help="the burst's requests one by one instead")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    add_reps(p, default=3)
    args = p.parse_args(argv)
    try:
        parse_throttles(f"disk:{args.slow}:0ms")
    except ValueError as exc:
        p.error(f"--slow {args.slow}: {exc}")
    import torch

    from kvoffload.bench.serve_bench import write_model

    torch.set_num_threads(args.threads)
    print(preamble(args.reps))
    p50: dict[str, list[float]] = {"plain": [], "tier": []}
    worst: dict[str, list[float]] = {"plain": [], "tier": []}
    given_up = []
    with tempfile.TemporaryDirectory(prefix="kvoffload-degrade-") as tmp:
        work = Path(tmp)
        write_model(work / "model", 8, 512, 8, 4, 32000)
        for _ in range(args.reps):
            for name in ("plain", "tier"):
                ttft, stats = run_once(work / "model", work, name == "tier", args)
                p50[name].append(statistics.median(ttft))
                worst[name].append(max(ttft))
                if name == "tier":
                    given_up.append(stats.get("loads_cancelled", 0))
    what = "one by one" if args.sequential else "at once"
    print(f"{args.burst} returning requests {what}, disk at {args.slow} after {args.warm} fast hits")
    for label, figures in (("TTFT p50", p50), ("slowest TTFT", worst)):
        plain, tier = Sample(tuple(figures["plain"])), Sample(tuple(figures["tier"]))
        print(f"  {label:<13} plain {plain.fmt()} s   with the tier {tier.fmt()} s   "
              f"ratio {tier.ratio(plain).fmt()}x")
    print(f"  loads given up (blocks): {', '.join(map(str, given_up))}")
    return 0
