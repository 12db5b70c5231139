"""``bench serve``'s table and plot: each configuration's figures as a median with its spread,
and its ratios to the baseline taken run by run."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from kvoffload.bench.measure import Sample
from kvoffload.bench.replica_timeline import timeline
from kvoffload.bench.serve_runs import RunResult, tokens_by_turn

FIGURES = [("ttft_p50_ms", "TTFT p50 (ms)", True), ("ttft_p95_ms", "TTFT p95 (ms)", True),
           ("ttft_p99_ms", "TTFT p99 (ms)", True), ("ret_ttft_p50_ms", "returning-turn TTFT p50 (ms)", True),
           ("ret_ttft_p95_ms", "returning-turn TTFT p95 (ms)", True), ("itl_mean_ms", "inter-token mean (ms)", True),
           ("req_per_s", "requests/s", False), ("out_tok_per_s", "output tokens/s", False)]


def _mean_per_run(counts: list[dict[str, float]]) -> dict[str, float]:
    """Each key's mean over the runs (a run without the key counts it 0)."""
    mean: dict[str, float] = {}
    for run in counts:
        for k, v in run.items():
            mean[k] = mean.get(k, 0) + v / len(counts)
    return mean


def report(runs: dict[str, list[RunResult]], engine: str = "vLLM",
           references: tuple[str, ...] = ("plain",)) -> tuple[str, dict[str, Any]]:
    """The figures of each configuration, and run-by-run ratios against each reference
    configuration present (plain vLLM; ``--also-vs`` adds one, e.g. the asynchronous loads)."""
    names = list(runs)
    lines: list[str] = []
    out: dict[str, Any] = {"configs": {}}
    header = f"{'':32}" + "".join(f"{n:>22}" for n in names)
    lines.append(header)
    plain = runs.get("plain")
    for key, label, lower_is_better in FIGURES:
        samples = {n: Sample(tuple(r.figures().get(key, 0.0) for r in rs)) for n, rs in runs.items()}
        if not any(s.median for s in samples.values()):
            continue
        lines.append(f"{label:32}" + "".join(f"{samples[n].fmt('.1f'):>22}" for n in names))
        for ref in (r for r in references if r in runs):
            ratios = {}
            for n in names:
                if n == ref:
                    continue
                # Run by run; "x better": reference/ours for latencies, ours/reference for rates.
                ratios[n] = (samples[ref].ratio(samples[n]) if lower_is_better else samples[n].ratio(samples[ref]))
            lines.append(f"{f'  vs {ref} (x better)':32}" + "".join(
                f"{(ratios[n].fmt('.2f') + 'x') if n in ratios else '':>22}" for n in names))
            for n, r in ratios.items():
                out["configs"].setdefault(n, {})[f"{key}_vs_{ref}"] = list(r.values)
        for n, s in samples.items():
            out["configs"].setdefault(n, {})[key] = list(s.values)
    for n, rs in runs.items():
        hits = _mean_per_run([run.hits for run in rs])
        lines.append(f"{'prefix hit tokens/run ' + n:31} " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(hits.items())))
        out["configs"].setdefault(n, {})["hit_tokens_per_run"] = hits
        decided = _mean_per_run([run.decisions for run in rs])
        if decided:
            lines.append(f"{'load decisions/run ' + n:31} " + ", ".join(f"{k} {v:,.1f}" for k, v in sorted(decided.items())))
            out["configs"][n]["load_decisions_per_run"] = decided
        per_replica = [run.replicas for run in rs if run.replicas]
        if per_replica:
            out["configs"][n]["replicas_per_run"] = per_replica
            for i, rep in enumerate(per_replica):
                lines.append(f"{f'  run {i + 1}, per replica':31} " + " | ".join(
                    f"r{j + 1}: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(r.items())) for j, r in enumerate(rep)))
        timelines = [tl for tl in (timeline(run.turns) for run in rs) if tl is not None]
        if timelines:  # routed runs: where each run's turns went, and how loaded each replica was
            out["configs"][n]["timeline_per_run"] = [tl.as_dict() for tl in timelines]
            for i, tl in enumerate(timelines):
                lines += [f"{f'  run {i + 1}, timeline' if j == 0 else '':31} {line}" for j, line in enumerate(tl.lines())]
    if plain is not None:
        for n, rs in runs.items():
            if n == "plain":
                continue
            same = sum(tokens_by_turn(a) == tokens_by_turn(b) for a, b in zip(plain, rs))
            lines.append(f"tokens identical to plain {engine:6} {n}: {same}/{len(rs)} runs")
            out["configs"][n]["identical_runs"] = same
    return "\n".join(lines), out


def plot(runs: dict[str, list[RunResult]], path: Path, workload: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, rs in runs.items():
        t = sorted(x * 1e3 for r in rs for x in r.ttfts())
        axes[0].plot(t, [(i + 1) / len(t) for i in range(len(t))], label=name)
        by_turn: dict[int, list[float]] = {}
        for r in rs:
            for tr in r.turns:
                if tr.completion.ttft is not None:
                    by_turn.setdefault(tr.turn, []).append(tr.completion.ttft * 1e3)
        turns = sorted(by_turn)
        axes[1].plot([k + 1 for k in turns], [statistics.median(by_turn[k]) for k in turns], marker="o", label=name)
        axes[1].set_xticks([k + 1 for k in turns])
    axes[0].set(title=f"TTFT CDF ({workload})", xlabel="time to first token (ms)", ylabel="fraction of requests")
    axes[1].set(title="median TTFT by turn", xlabel="turn", ylabel="ms")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- CLI -----------------------------------------------------------------------------------
