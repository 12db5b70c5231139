"""Hit ratio and returning TTFT against total tier size, the knee and the recommendation marked."""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.plan.advice import Advice
from kvoffload.plan.planner import PlanResult


def plot_plan(results: Sequence[PlanResult], advice: Advice, path: str, slo_pick: PlanResult | None = None) -> None:
    """``slo_pick``: the configuration ``--slo`` chose, marked too."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError(f"--plot {path}: needs matplotlib (pip install 'kvoffload[plot]')") from None
    from kvoffload.plan.tier_spec import format_size

    rs = sorted(results, key=lambda r: r.size_bytes)
    gib = [r.size_bytes / 2**30 for r in rs]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(gib, [r.hit_ratio * 100 for r in rs], "o-", color="tab:blue", label="tokens from tiers (%)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gib, [format_size(r.size_bytes) for r in rs], rotation=30)
    ax.minorticks_off()
    ax.set_xlabel("tier size, all tiers")
    ax.set_ylabel("prompt tokens served by the tiers (%)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(gib, [r.ttft_p50_s * 1e3 for r in rs], "s--", color="tab:red", label="returning TTFT p50 (ms)")
    ax2.axhline(rs[0].base_ttft_p50_s * 1e3, color="tab:red", linestyle=":", label="TTFT p50 without offload")
    ax2.set_ylabel("returning TTFT p50 (ms)", color="tab:red")
    marks = [(advice.recommended, "*", "recommended")] if advice.recommended is not None else []
    if advice.knee is not None:
        marks.insert(0, (advice.knee, "v", "knee" if advice.knee is not advice.recommended else "knee, recommended"))
    marks = marks if advice.knee is not advice.recommended else marks[:1]
    if slo_pick is not None:
        marks.append((slo_pick, "D", "meets --slo"))
    for i, (r, mark, text) in enumerate(marks):
        ax.plot([r.size_bytes / 2**30], [r.hit_ratio * 100], mark, markersize=14, color="black")
        ax.annotate(text, (r.size_bytes / 2**30, r.hit_ratio * 100), textcoords="offset points",
                    xytext=(0, -24 - 12 * i), ha="center")
    ax.set_title("kvoffload plan")
    fig.legend(loc="upper left", bbox_to_anchor=(0.12, 0.88), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
