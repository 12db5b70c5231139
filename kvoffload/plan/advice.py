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
    #: None where no configuration tried serves anything from its tiers.
    recommended: PlanResult | None
    best: PlanResult
    paragraph: str
    #: The recommended chain less its trailing tiers that served nothing (its label, its size).
    buy_label: str = ""
    buy_bytes: int = 0


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


def _footprint(working_set_bytes: int, device_bytes: int) -> str:
    fits = "holds it" if working_set_bytes <= device_bytes else "holds " + (
        f"{device_bytes / working_set_bytes:.0%} of it" if working_set_bytes else "none of it")
    return (f"The log's working set (the KV of every distinct block it stores) is {format_size(working_set_bytes)}; "
            f"the device cache, {format_size(device_bytes)}, {fits}.")


def _without_idle_tail(r: PlanResult) -> tuple[str, int, list[str]]:
    """The chain without its trailing secondary tiers that served nothing: a tier below the host
    tier that no hit reached buys nothing (one above a tier that served is kept: the blocks reach
    the lower one through it)."""
    parts = r.label.split("+")
    keep = len(r.tiers)
    while keep > 1 and r.tiers[keep - 1].tokens_served == 0:
        keep -= 1
    idle = [t.medium for t in r.tiers[keep:]]
    return "+".join(parts[:keep]), sum(t.size_bytes for t in r.tiers[:keep]), idle


def advise(results: Sequence[PlanResult], within: float = 0.05, knee_share: float = 0.1,
           working_set_bytes: int = 0, device_bytes: int = 0) -> Advice:
    """The configuration to buy: the smallest within ``within`` of the most prefill saved among
    those whose returning-turn TTFT p50 and p95 are no worse than without offload (any
    configuration only when none is, and then the answer says so first); tiers that served
    nothing are left out of it; where nothing pays, the answer says that instead."""
    footprint = _footprint(working_set_bytes, device_bytes)
    best = max(results, key=lambda r: r.prefill_s_saved)
    if best.prefill_s_saved <= 0:
        if working_set_bytes <= device_bytes:
            text = ("Offload is not needed for this log: the device cache holds its working set, so every repeated "
                    "prefix is served from it. " + footprint)
        else:
            text = ("No configuration tried serves anything from its tiers: the prefixes the device cache evicts do "
                    f"not come back while the tiers tried still hold them. {footprint} Try tiers of at least "
                    f"{format_size(working_set_bytes - device_bytes)}, or check that the log repeats prefixes.")
        return Advice(None, None, best, text)
    no_worse = [r for r in results if r.prefill_s_saved > 0 and r.ttft_p50_s <= r.base_ttft_p50_s
                and r.ttft_p95_s <= r.base_ttft_p95_s]
    pool = no_worse or [r for r in results if r.prefill_s_saved > 0]
    top = max(pool, key=lambda r: r.prefill_s_saved)
    good = [r for r in pool if r.prefill_s_saved >= (1 - within) * top.prefill_s_saved]
    rec = min(good, key=lambda r: (r.size_bytes, -r.prefill_s_saved))
    knee = find_knee(results, knee_share)
    label, size, idle = _without_idle_tail(rec)
    speedup = rec.base_ttft_p50_s / rec.ttft_p50_s if rec.ttft_p50_s > 0 else float("inf")
    text = ""
    if not no_worse:
        text = ("Every configuration tried makes returning requests' time to first token worse than without "
                "offload (p50 or p95): the tiers load slower than the engine recomputes, or their loads queue. "
                "If prefill compute is what you need to save, the least harmful is: ")
    text += (f"Buy {label} ({format_size(size)} in all): it serves {rec.hit_ratio:.1%} of prompt tokens "
             f"from the tiers and saves {rec.prefill_s_saved:,.1f} s of prefill, within {within:.0%} of the best "
             f"configuration tried{' without a worse TTFT' if no_worse and top is not best else ''} "
             f"({top.label}, {top.prefill_s_saved:,.1f} s); returning requests' time to first "
             f"token p50 {rec.ttft_p50_s * 1e3:,.1f} ms against {rec.base_ttft_p50_s * 1e3:,.1f} ms without offload "
             f"({speedup:.2f}x), p95 {rec.ttft_p95_s * 1e3:,.1f} ms against {rec.base_ttft_p95_s * 1e3:,.1f} ms.")
    if idle:
        text += (f" Its {' and '.join(idle)} tier{'s' if len(idle) > 1 else ''} ({rec.label}) served nothing on this "
                 "log: leave it out.")
    if no_worse and best not in no_worse:
        text += (f" {best.label} saves more prefill ({best.prefill_s_saved:,.1f} s) but makes TTFT worse "
                 f"(p50 {best.ttft_p50_s * 1e3:,.1f} ms, p95 {best.ttft_p95_s * 1e3:,.1f} ms).")
    if knee is not None and knee is max(results, key=lambda r: r.size_bytes):
        text += f" The sweep has not reached its knee: its largest size, {knee.label}, still pays; try larger ones."
    elif knee is not None:
        text += (f" The knee of the sweep is {knee.label}: past it, a GiB buys less than {knee_share:.0%} of the "
                 "prefill time a GiB buys at the sweep's most efficient size.")
    busiest = max(rec.tiers, key=lambda t: t.peak_load_bytes_per_s)
    if busiest.peak_load_bytes_per_s > 0:
        text += (f" Its {busiest.medium} tier must sustain {rate(busiest.load_bytes_per_s)} of loads on average and "
                 f"{rate(busiest.peak_load_bytes_per_s)} in the busiest second.")
    return Advice(knee, rec, best, text + " " + footprint, label, size)
