"""kvoffload bench degrade: a disk tier that slows down after ``auto`` timed it fast, against
recomputing everything (plain): time to first token of returning requests.

Contexts are stored and written through to a disk tier; ``--warm`` hits are served from it while
it is fast (the load cost model times it); then the disk reads at ``--slow`` (a test wrapper,
``kvoffload.testing.throttle``; ``--one-queue``: its reads and writes served one at a time, as by
one congested device) and two phases follow, each on contexts of its own: ``--burst`` requests
arrive at once, then ``--one-by-one`` requests each after the last one's answer. The figures
are each phase's TTFT p50 (and its slowest request) with the tier, over plain's in the same
run and conditions: a tier that went slow should cost about nothing (its loads are given up or
never planned), where waiting for it would cost each request its slow load. ``--hogs N`` runs N
CPU-bound processes beside both configurations (a busy machine).
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvoffload.bench.measure import Sample, add_reps, bench_parser, positive_int, preamble
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.testing.throttle import ThrottledOffloadingSpec, parse_throttles

#: Reads a warm-up hit takes: a 1 MiB piece at a time (the disk tier's load pieces).
_PIECE = 1 << 20
PHASES = ("burst", "one by one")


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


def _spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


@contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """``n`` processes spinning on a core each while the block runs (a busy machine)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        stop.set()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


def run_once(model: Path, work: Path, offload: bool, args: Any) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """One run: store, warm the tier, then the burst and the one-by-one phase."""
    kv = None
    if offload:
        block_bytes = 16 * 16 * 1024  # 16 tokens x 16 KiB a token (the model below)
        blocks = -(-(args.context + 16) // 16)
        reads = args.warm * -(-(blocks * block_bytes) // _PIECE)
        queue = ":queue" if args.one_queue else ""
        ThrottledOffloadingSpec.throttles = parse_throttles(f"disk:{args.slow}:0ms:after={reads}{queue}")
        kv = {"tiers": [{"medium": "cpu", "capacity": args.cpu},
                        {"medium": "disk", "path": str(work / f"disk-{time.monotonic_ns()}"), "capacity": "4GiB",
                         "write_through": True, "max_store_ms_per_mib": 60000}],
              "spec_name": "ThrottledOffloadingSpec", "spec_module_path": "kvoffload.testing.throttle"}
    cfg = EngineConfig(model=str(model), load_format="dummy", dtype="float32", block_size=16, num_gpu_blocks=600,
                       max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=2048, kv_offload=kv)
    ttft: dict[str, list[float]] = {}
    with LLM(cfg) as llm:
        n = args.warm + args.burst + args.one_by_one
        for i in range(n):
            _serve(llm, [_prompt(i, 0, args.context)])
        _drain(llm)
        for i in range(args.warm):  # hits from the disk while it is fast
            _serve(llm, [_prompt(i, 1, args.context)])
            _drain(llm)
        first = args.warm
        if args.burst:
            ttft["burst"] = _serve(llm, [_prompt(first + k, 2, args.context) for k in range(args.burst)])
            _drain(llm)
        first += args.burst
        if args.one_by_one:
            ttft["one by one"] = [_serve(llm, [_prompt(first + k, 2, args.context)])[0]
                                  for k in range(args.one_by_one)]
        stats = dict(llm.stats().get("connector", {}))
    return ttft, stats


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("degrade", __doc__)
    p.add_argument("--context", type=positive_int, default=512, help="tokens of each stored context")
    p.add_argument("--warm", type=positive_int, default=6, help="hits served while the disk is fast")
    p.add_argument("--burst", type=int, default=8, help="requests arriving together after the slowdown (0: none)")
    p.add_argument("--one-by-one", type=int, default=0,
                   help="requests after the burst, each after the last one's answer (0: none)")
    p.add_argument("--slow", default="1MB/s", help="the disk's read speed after the warm-up")
    p.add_argument("--one-queue", action="store_true",
                   help="the slow disk serves its reads and writes one at a time (one congested device)")
    p.add_argument("--hogs", type=int, default=0, help="CPU-bound processes running beside both configurations")
    p.add_argument("--cpu", default="32MiB", help="the CPU tier (small: hits come from the disk)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    add_reps(p, default=3)
    args = p.parse_args(argv)
    try:
        parse_throttles(f"disk:{args.slow}:0ms")
    except ValueError as exc:
        p.error(f"--slow {args.slow}: {exc}")
    for flag, value in (("--burst", args.burst), ("--one-by-one", args.one_by_one), ("--hogs", args.hogs)):
        if not 0 <= value <= 64:
            p.error(f"{flag} {value}: give 0 to 64")
    if not args.burst and not args.one_by_one:
        p.error("--burst 0 and --one-by-one 0: give at least one phase")
    import torch

    from kvoffload.bench.dummy_model import write_model

    torch.set_num_threads(args.threads)
    print(preamble(args.reps))
    phases = [ph for ph, n in zip(PHASES, (args.burst, args.one_by_one)) if n]
    p50 = {(ph, c): [] for ph in phases for c in ("plain", "tier")}  # type: dict[tuple[str, str], list[float]]
    worst = {key: [] for key in p50}  # type: dict[tuple[str, str], list[float]]
    given_up = []
    with tempfile.TemporaryDirectory(prefix="kvoffload-degrade-") as tmp, cpu_hogs(args.hogs):
        work = Path(tmp)
        write_model(work / "model", 8, 512, 8, 4, 32000)
        for _ in range(args.reps):
            for name in ("plain", "tier"):
                ttft, stats = run_once(work / "model", work, name == "tier", args)
                for ph in phases:
                    p50[ph, name].append(statistics.median(ttft[ph]))
                    worst[ph, name].append(max(ttft[ph]))
                if name == "tier":
                    given_up.append(stats.get("cancelled_load_blocks", 0))
    device = "one queue" if args.one_queue else "reads side by side"
    busy = f", {args.hogs} CPU-bound processes beside" if args.hogs else ""
    print(f"disk at {args.slow} ({device}) after {args.warm} fast hits{busy}")
    for ph in phases:
        count = args.burst if ph == "burst" else args.one_by_one
        print(f" {count} returning requests {'at once' if ph == 'burst' else 'one by one'}:")
        for label, figures in (("TTFT p50", p50), ("slowest TTFT", worst)):
            plain, tier = Sample(tuple(figures[ph, "plain"])), Sample(tuple(figures[ph, "tier"]))
            print(f"  {label:<13} plain {plain.fmt()} s   with the tier {tier.fmt()} s   "
                  f"ratio {tier.ratio(plain).fmt()}x")
    print(f"  loads given up (blocks): {', '.join(map(str, given_up))}")
    return 0
