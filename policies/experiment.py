"""`kvoffload sim`: replay a trace over policies x capacities; table, CSV/JSON and a PNG plot."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .session_hints import MODES as HINT_MODES
from .session_hints import derive
from .simulator import SimResult, group_blocks, replay

_TRACE: dict[str, Any] = {}


def load_trace(path: str, fmt: str, limit: int | None) -> tuple[list[list], list[int] | None, int, str]:
    """(requests, input lengths or None, tokens per block, replay mode)."""
    from kvoffload import traces

    if fmt == "auto":
        name = os.path.basename(path)
        fmt = ("arc" if ".lis" in name else "weka" if name.endswith(".tar.gz")
               else "synthetic" if path == "synthetic" else "mooncake")
    if fmt == "mooncake":
        import gzip

        reqs, lengths = [], []
        with open(path, "rb") as raw, traces.progress_bar(path) as bar, \
                (gzip.open(raw, "rt") if path.endswith(".gz") else io.TextIOWrapper(raw)) as f:
            for n, line in enumerate(f, 1):
                if n % 4096 == 0:
                    bar.update(raw.tell() - bar.n)
                if line.strip():
                    try:
                        rec = json.loads(line)
                        hashes = rec["hash_ids"]
                    except (ValueError, KeyError, TypeError):
                        raise ValueError(
                            f"{path}: line {n} is not a Mooncake record with block hashes (\"hash_ids\"); a trace of "
                            "request sizes only (e.g. Azure's CSV) has nothing to replay: use a Mooncake .jsonl, "
                            "WEKA .tar.gz or ARC .lis trace, or --format"
                        ) from None
                    reqs.append(hashes)
                    lengths.append(int(rec.get("input_length", 512 * len(rec["hash_ids"]))))
                    if limit and len(reqs) >= limit:
                        break
        return reqs, lengths, 512, "prefix"
    if fmt == "weka":
        requests = traces.load_weka_requests(path, limit)
        _TRACE["sessions"] = requests
        return [r.blocks for r in requests], None, 64, "prefix"
    if fmt == "arc":
        return traces.load_arc_lis(path, limit), None, 1, "page"
    if fmt == "synthetic":
        return traces.synthetic_prefix_workload(limit or 5000), None, 16, "prefix"
    raise ValueError(f"--format {fmt!r}: use auto, mooncake, weka, arc or synthetic")


def parse_capacities(spec: str, unique_blocks: int, block_bytes: int | None = None) -> list[int]:
    """Capacities in blocks: shares of the trace's unique blocks (``5%``), block counts, or
    sizes (``1GiB``) divided by ``block_bytes``."""
    from kvoffload.config import ConfigError, parse_size

    out = []
    for part in spec.split(","):
        part = part.strip()
        if part.endswith("%"):
            out.append(max(1, int(unique_blocks * float(part[:-1]) / 100)))
        elif part.isdigit():
            out.append(int(part))
        else:
            try:
                size = parse_size(part, "--capacities")
            except ConfigError:
                raise ValueError(f"--capacities entry {part!r}: use a share like 5%, a block count, or a size "
                                 "like 1GiB (with --block-bytes)") from None
            if block_bytes is None:
                raise ValueError(f"--capacities entry {part!r} is a size: give --block-bytes (bytes per offloaded "
                                 "block of your model) to turn it into blocks")
            out.append(max(1, size // block_bytes))
    return out


def _init(path: str, fmt: str, limit: int | None, factor: int) -> None:
    reqs, lengths, tpb, mode = load_trace(path, fmt, limit)
    _TRACE.update(reqs=group_blocks(reqs, factor), lengths=lengths, tpb=tpb * factor, mode=mode)


#: The speed baseline replayed at every capacity: LRU on the Python ledger (what every policy
#: ran on before the native ledger), so each row's refs/s has a same-run reference.
BASELINE = ("lru", 0, False)


def _run(job: tuple[str, int, int, bool | None]) -> dict:
    name, capacity, threshold, native = job
    policy, _, mode = name.partition("@")
    hints = None
    if mode:
        if "sessions" not in _TRACE:
            raise ValueError(f"{name}: this trace has no sessions to derive hints from (WEKA has)")
        hints = derive(_TRACE["sessions"], mode)
    r = replay(_TRACE["reqs"], capacity, policy, threshold, _TRACE["tpb"], _TRACE["lengths"], _TRACE["mode"], native,
               hints, label=name)
    return r.as_dict()


def run_experiment(path: str, fmt: str, policies: list[str], capacities: str, thresholds: list[int], factor: int,
                   limit: int | None, workers: int, block_bytes: int | None = None) -> tuple[list[dict], int]:
    _init(path, fmt, limit, factor)
    unique = len({b for r in _TRACE["reqs"] for b in r})
    caps = parse_capacities(capacities, unique, block_bytes)
    jobs: list[tuple[str, int, int, bool | None]] = [(p, c, t, None) for c in caps for t in thresholds for p in policies]
    jobs += [(BASELINE[0], c, BASELINE[1], BASELINE[2]) for c in caps]
    from tqdm import tqdm

    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers, initializer=_init, initargs=(path, fmt, limit, factor)) as pool:
            results = list(tqdm(pool.map(_run, jobs), total=len(jobs), desc="replays", unit="run"))
    else:
        results = [_run(j) for j in tqdm(jobs, desc="replays", unit="run")]
    baseline = {r["capacity"]: r["refs_per_s"] for r in results[len(jobs) - len(caps):]}
    results = results[: len(jobs) - len(caps)]
    for r in results:
        r["baseline_refs_per_s"] = baseline[r["capacity"]]
    # References: plain LRU and MIN (no admission filter) at the same capacity.
    best: dict[int, float] = {}
    lru: dict[int, float] = {}
    for r in results:
        if r["store_threshold"] < 2 and r["policy"] == "belady":
            best[r["capacity"]] = r["block_hit_ratio"]
        if r["store_threshold"] < 2 and r["policy"] == "lru":
            lru[r["capacity"]] = r["block_hit_ratio"]
    for r in results:
        cap = r["capacity"]
        if cap in best:
            r["gap_to_belady"] = best[cap] - r["block_hit_ratio"]
            if cap in lru and best[cap] > lru[cap]:
                r["lru_to_min_gap_closed"] = (r["block_hit_ratio"] - lru[cap]) / (best[cap] - lru[cap])
    return results, unique


#: One colour per policy; the reuse filter's runs share their policy's colour, dashed.
_THRESHOLD_STYLES = ["-", "--", ":", "-."]


def write_outputs(results: list[dict], out: Path, title: str, unique_blocks: int | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.csv"]
    (out / "results.json").write_text(json.dumps(results, indent=1))
    with open(out / "results.csv", "w", newline="") as f:  # one row per replay: the per-window series stay in JSON
        w = csv.DictWriter(f, fieldnames=sorted({k for r in results for k in r} - {"window_hit_ratios"}))
        w.writeheader()
        w.writerows({k: v for k, v in r.items() if k != "window_hit_ratios"} for r in results)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no PNG; pip install 'kvoffload[plot]')")
        return written
    fig, ax = plt.subplots(figsize=(9, 4.8))
    policies = sorted({r["policy"] for r in results})
    thresholds = sorted({r["store_threshold"] for r in results})
    online = [p for p in policies if p != "belady"]
    colours = plt.get_cmap("tab10" if len(online) <= 10 else "tab20")
    markers = "osD^v<>pPX*h"
    for (policy, threshold) in sorted({(r["policy"], r["store_threshold"]) for r in results}):
        rows = sorted((r for r in results if r["policy"] == policy and r["store_threshold"] == threshold),
                      key=lambda r: r["capacity"])
        xs = [100 * r["capacity"] / unique_blocks if unique_blocks else r["capacity"] for r in rows]
        ys = [100 * r["block_hit_ratio"] for r in rows]
        if policy == "belady" and threshold < 2:
            # The offline optimum: a bound no online policy reaches, drawn as one (not another line).
            ax.plot(xs, ys, color="black", linewidth=2.2, linestyle=(0, (1, 1)), label="MIN (Belady): upper bound")
            continue
        label = policy if threshold < 2 else f"{policy}, store on sighting {threshold}"
        style = _THRESHOLD_STYLES[thresholds.index(threshold) % len(_THRESHOLD_STYLES)]
        i = online.index(policy) if policy in online else len(online)
        ax.plot(xs, ys, label=label, linestyle=style, color=colours(i % colours.N), marker=markers[i % len(markers)],
                markerfacecolor="white" if threshold >= 2 else None)
    ax.set_xscale("log")
    ticks = sorted({100 * r["capacity"] / unique_blocks if unique_blocks else r["capacity"] for r in results})
    ax.set_xticks(ticks, [f"{t:.2g}%" if unique_blocks else f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xlabel(f"capacity (% of the trace's {unique_blocks:,} unique blocks)" if unique_blocks
                  else "capacity (offloaded blocks)")
    ax.set_ylabel("block hit ratio (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "hit_ratio.png", dpi=120)
    written.append(out / "hit_ratio.png")
    plt.close(fig)
    written += _plot_over_time(plt, results, out, title, online, colours, markers, thresholds)
    return written


def _plot_over_time(plt: Any, results: list[dict], out: Path, title: str, online: list[str], colours: Any,
                    markers: str, thresholds: list[int]) -> list[Path]:
    """Block hit ratio in each slice of the trace, at the largest capacity replayed."""
    rows = [r for r in results if r.get("window_hit_ratios")]
    if not rows:
        return []
    cap = max(r["capacity"] for r in rows)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for r in sorted((r for r in rows if r["capacity"] == cap), key=lambda r: (r["policy"], r["store_threshold"])):
        series = r["window_hit_ratios"]
        xs = [100 * (i + 0.5) / len(series) for i in range(len(series))]
        ys = [100 * v for v in series]
        if r["policy"] == "belady" and r["store_threshold"] < 2:
            ax.plot(xs, ys, color="black", linewidth=2.2, linestyle=(0, (1, 1)), label="MIN (Belady): upper bound")
            continue
        i = online.index(r["policy"]) if r["policy"] in online else len(online)
        style = _THRESHOLD_STYLES[thresholds.index(r["store_threshold"]) % len(_THRESHOLD_STYLES)]
        label = r["policy"] if r["store_threshold"] < 2 else f"{r['policy']}, store on sighting {r['store_threshold']}"
        ax.plot(xs, ys, label=label, linestyle=style, color=colours(i % colours.N), marker=markers[i % len(markers)],
                markersize=4, markerfacecolor="white" if r["store_threshold"] >= 2 else None)
    ax.set_xlabel("position in the trace (% of its requests)")
    ax.set_ylabel("block hit ratio in that slice (%)")
    ax.set_title(f"{title.replace(' vs capacity', ' over time')}, capacity {cap:,} blocks", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "hit_ratio_over_time.png", dpi=120)
    plt.close(fig)
    return [out / "hit_ratio_over_time.png"]


GLOSSARY = ("gap→MIN: MIN's block hit ratio minus this row's, in points (MIN is the offline optimum at that "
            "capacity);\nLRU→MIN closed: how much of LRU's gap to MIN this row closes (100% = as good as MIN, 0% = "
            "as LRU, negative = worse than LRU: -137% lost 1.37 times that gap);\nMrefs/s: block references "
            "replayed per second (replays share the --workers processes); x py-LRU: that speed over LRU on the "
            "Python ledger, replayed at the same capacity in the same run.")


def format_results(results: list[dict]) -> str:
    w = max([12, *(len(str(r["policy"])) + 2 for r in results)])  # module:Class names can be long
    head = (f"{'policy':<{w}}{'filter':>7}{'capacity':>10}{'block hit':>10}{'token hit':>10}{'written':>10}"
            f"{'evicted':>10}{'gap→MIN':>9}{'LRU→MIN closed':>16}{'Mrefs/s':>9}{'x py-LRU':>9}")
    lines = [head]
    for r in sorted(results, key=lambda r: (r["capacity"], r["store_threshold"], r["policy"])):
        gap = f"{100 * r['gap_to_belady']:.2f}" if "gap_to_belady" in r else "-"
        closed = f"{100 * r['lru_to_min_gap_closed']:.1f}%" if "lru_to_min_gap_closed" in r else "-"
        flag = "  BEATS MIN" if r.get("gap_to_belady", 0) < -1e-12 else ""
        rate, base = r.get("refs_per_s"), r.get("baseline_refs_per_s")
        mrefs = f"{rate / 1e6:.2f}" if rate else "-"
        speed = f"{rate / base:.2f}x" if rate and base else "-"
        lines.append(f"{r['policy']:<{w}}{r['store_threshold']:>7}{r['capacity']:>10}{100 * r['block_hit_ratio']:>9.2f}%"
                     f"{100 * r['token_hit_ratio']:>9.2f}%{r['blocks_written']:>10}{r['evicted_blocks']:>10}"
                     f"{gap:>9}{closed:>16}{mrefs:>9}{speed:>9}{flag}")
    return "\n".join(lines)




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvoffload sim", description=__doc__)
    parser.add_argument("--trace", required=True,
                        help="trace file; 'mooncake-sample' (1,500 requests of the Mooncake conversation trace, "
                             "shipped with the package); or 'synthetic'")
    parser.add_argument("--format", default="auto", choices=["auto", "mooncake", "weka", "arc", "synthetic"])
    parser.add_argument("--policies", default="lru,arc,s3fifo,sieve,belady",
                        help="comma list; POLICY@honest / POLICY@oracle replays it with hints derived from the "
                             "trace's sessions (WEKA): what each caller knew, or each session's true next return")
    parser.add_argument("--capacities", default="1%,5%,10%,20%",
                        help="comma list: shares of the trace's unique blocks (5%%), block counts, or sizes (1GiB, "
                             "with --block-bytes)")
    parser.add_argument("--block-bytes", type=int, default=None,
                        help="bytes per offloaded block of your model (kvoffload config check --model prints it)")
    parser.add_argument("--store-threshold", default="0", help="comma list, e.g. 0,2 (>= 2 enables the filter)")
    parser.add_argument("--block-size-factor", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="sim-out")
    args = parser.parse_args(argv)
    if args.trace != "synthetic":
        from kvoffload import traces

        try:
            args.trace = str(traces.resolve_trace(args.trace))
        except ValueError as exc:
            parser.error(str(exc))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    from kvoffload.offload import get_policy_class

    for p in policies:
        name, _, mode = p.partition("@")
        get_policy_class(name)  # unknown names fail before any replay
        if mode and mode not in HINT_MODES:
            parser.error(f"--policies {p}: hints after @ are none, honest or oracle (e.g. hinted@honest)")
    thresholds = [int(t) for t in args.store_threshold.split(",")]
    try:
        parse_capacities(args.capacities, 1, args.block_bytes)  # its errors before the trace is read
    except ValueError as exc:
        parser.error(str(exc))
    results, unique = run_experiment(args.trace, args.format, policies, args.capacities, thresholds,
                                     args.block_size_factor, args.limit, args.workers, args.block_bytes)
    print(f"trace {args.trace}: {unique:,} unique blocks")
    print(format_results(results))
    print(GLOSSARY)
    title = f"Block hit ratio vs capacity: {os.path.basename(args.trace)} ({unique:,} unique blocks)"
    for path in write_outputs(results, Path(args.out), title, unique):
        print(f"wrote {path}")
    return 0


__all__ = ["SimResult", "main", "run_experiment"]
