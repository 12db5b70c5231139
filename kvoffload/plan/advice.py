"""The answer a plan gives: the knee of its sweep and the configuration to buy."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.plan.planner import PlanResult
from kvoffload.plan.tier_spec import format_size


def rate(bytes_per_s: float) -> str:
    """A bandwidth in the unit that reads best (GB/s, MB/s, kB/s)."""
    if bytes_per_s <= 0:
        return "0"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.2f} {unit}"
    return f"{bytes_per_s / 1e3:.2f} kB/s"


@dataclass(frozen=True, slots=True)
class Advice:
    knee: PlanResult | None
    recommended: PlanResult
    best: PlanResult
    paragraph: str


def find_knee(results: Sequence[PlanResult], share: float) -> PlanResult | None:
    """In order of size: the first configuration that saves anything and past which another GiB
    buys less than ``share`` of the prefill time a GiB buys in the sweep's best configuration
    for its size (None: fewer than three sizes, or nothing saved anywhere)."""
    by_size = sorted(results, key=lambda r: r.size_bytes)
    if len(by_size) < 3:
        return None
    best_rate = max(r.prefill_s_saved / (r.size_bytes / 2**30) for r in by_size)
    if best_rate <= 0:
        return None
    for a, b in itertools.pairwise(by_size):
        gib = (b.size_bytes - a.size_bytes) / 2**30
        if a.prefill_s_saved > 0 and gib > 0 and (b.prefill_s_saved - a.prefill_s_saved) / gib < share * best_rate:
            return a
    return by_size[-1]


def advise(results: Sequence[PlanResult], within: float = 0.05, knee_share: float = 0.1) -> Advice:
    best = max(results, key=lambda r: r.prefill_s_saved)
    good = [r for r in results if r.prefill_s_saved >= (1 - within) * best.prefill_s_saved]
    rec = min(good, key=lambda r: (r.size_bytes, -r.prefill_s_saved))
    knee = find_knee(results, knee_share)
    speedup = rec.base_ttft_p50_s / rec.ttft_p50_s if rec.ttft_p50_s > 0 else float("inf")
    text = (f"Buy {rec.label} ({format_size(rec.size_bytes)} in all): it serves {rec.hit_ratio:.1%} of prompt tokens "
            f"from the tiers and saves {rec.prefill_s_saved:,.1f} s of prefill, within {within:.0%} of the best "
            f"configuration tried ({best.label}, {best.prefill_s_saved:,.1f} s); returning requests' time to first "
            f"token p50 {rec.ttft_p50_s * 1e3:,.1f} ms against {rec.base_ttft_p50_s * 1e3:,.1f} ms without offload "
            f"({speedup:.2f}x), p95 {rec.ttft_p95_s * 1e3:,.1f} ms against {rec.base_ttft_p95_s * 1e3:,.1f} ms.")
    if knee is not None and knee is max(results, key=lambda r: r.size_bytes):
        text += f" The sweep has not reached its knee: its largest size, {knee.label}, still pays; try larger ones."
    elif knee is not None:
        text += (f" The knee of the sweep is {knee.label}: past it, a GiB buys less than {knee_share:.0%} of the "
                 "prefill time a GiB buys at the sweep's most efficient size.")
    busiest = max(rec.tiers, key=lambda t: t.peak_load_bytes_per_s)
    if busiest.peak_load_bytes_per_s > 0:
        text += (f" Its {busiest.medium} tier must sustain {rate(busiest.load_bytes_per_s)} of loads on average and "
                 f"{rate(busiest.peak_load_bytes_per_s)} in the busiest second.")
    return Advice(knee, rec, best, text)
