"""The answer in an operator's terms: the cheapest configuration of the sweep that meets the
service-level objectives (``--slo ttft_p95=2s``), at the prices given (``--price cpu=4/GiB``),
or, where none meets them, which objective binds and how close the nearest configuration gets.

Prices are per GiB of each medium, in whatever currency and period the operator gives (the
answer repeats them); only the tiers are priced (the device cache is there either way).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.errors import describe_value
from kvoffload.plan.planner import QUEUEING_NOTE, PlanResult
from kvoffload.plan.tier_spec import TierSpecError, format_size

#: Objective name -> whether its figure must stay below the bound (else reach it): returning
#: requests' TTFT p50 and p95, and the prefill seconds saved.
OBJECTIVES = {"ttft_p50": True, "ttft_p95": True, "prefill_saved": False}
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|min)$")
_PRICE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)/(KiB|MiB|GiB|TiB)$")
_SCALE = {"ms": 1e-3, "s": 1.0, "min": 60.0}
_UNIT = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
#: The longest objective taken: a day (a bound past it is no service level).
MAX_SECONDS = 86400.0


@dataclass(frozen=True, slots=True)
class Objective:
    name: str
    bound: float  # seconds

    def value(self, r: PlanResult) -> float:
        return {"ttft_p50": r.ttft_p50_s, "ttft_p95": r.ttft_p95_s, "prefill_saved": r.prefill_s_saved}[self.name]

    @property
    def below(self) -> bool:
        return OBJECTIVES[self.name]

    def met(self, r: PlanResult) -> bool:
        return self.value(r) <= self.bound if self.below else self.value(r) >= self.bound

    def without_offload(self, r: PlanResult) -> float | None:
        return {"ttft_p50": r.base_ttft_p50_s, "ttft_p95": r.base_ttft_p95_s}.get(self.name)

    def show(self, seconds: float | None = None) -> str:
        v = self.bound if seconds is None else seconds
        return f"{v * 1e3:,.1f} ms" if v < 1 else f"{v:,.2f} s"

    @property
    def text(self) -> str:
        return f"{self.name} {'<=' if self.below else '>='} {self.show()}"


def parse_slo(text: str) -> list[Objective]:
    """``ttft_p95=2s,ttft_p50=500ms,prefill_saved=60s``."""
    out: list[Objective] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        m = _DURATION.match(value.strip())
        if name.strip() not in OBJECTIVES or not m:
            raise TierSpecError(f"--slo {describe_value(part)}: write NAME=DURATION with NAME one of "
                                f"{', '.join(OBJECTIVES)}, e.g. ttft_p95=2s or ttft_p50=500ms")
        bound = float(m.group(1)) * _SCALE[m.group(2)]
        if not bound <= MAX_SECONDS:  # 400 digits: inf, and the answer read "<= inf s"
            raise TierSpecError(f"--slo {describe_value(part)}: give a duration of at most a day, e.g. ttft_p95=2s")
        if any(o.name == name.strip() for o in out):
            raise TierSpecError(f"--slo {describe_value(part)}: {name.strip()} is given twice; give each objective once")
        out.append(Objective(name.strip(), bound))
    if not out:
        raise TierSpecError("--slo '': give at least one objective, e.g. ttft_p95=2s")
    return out


def parse_prices(text: str) -> dict[str, float]:
    """``cpu=4/GiB,disk=0.1/GiB``: a price per byte of each medium."""
    prices = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        medium, _, value = part.partition("=")
        m = _PRICE.match(value.strip())
        if not medium.strip() or not m:
            raise TierSpecError(f"--price {describe_value(part)}: write MEDIUM=AMOUNT/UNIT, e.g. cpu=4/GiB or "
                                "disk=0.1/GiB (any currency and period, the same for every medium)")
        if medium.strip() in prices:
            raise TierSpecError(f"--price {describe_value(part)}: {medium.strip()} is priced twice; give each medium "
                                "one price")
        amount = float(m.group(1))
        if not amount <= 1e15:
            raise TierSpecError(f"--price {describe_value(part)}: give an amount of at most 1e15 per unit")
        prices[medium.strip()] = amount / _UNIT[m.group(2)]
    if not prices:
        raise TierSpecError("--price '': give each medium's price, e.g. cpu=4/GiB,disk=0.1/GiB")
    return prices


def cost(r: PlanResult, prices: dict[str, float]) -> float:
    missing = sorted({t.medium for t in r.tiers} - set(prices))
    if missing:
        raise TierSpecError(f"--price: no price for {', '.join(missing)} ({r.label} uses it); add "
                            f"{missing[0]}=AMOUNT/GiB")
    return sum(t.size_bytes * prices[t.medium] for t in r.tiers)


@dataclass(frozen=True, slots=True)
class SloAnswer:
    chosen: PlanResult | None
    cost: float
    paragraph: str


def answer(results: Sequence[PlanResult], objectives: Sequence[Objective], prices: dict[str, float] | None,
           queueing: float = 1.0) -> SloAnswer:
    """The cheapest configuration meeting every objective (the smallest where no prices are
    given), or why none does."""
    price_of = (lambda r: cost(r, prices)) if prices else (lambda r: float(r.size_bytes))
    for r in results:
        price_of(r)  # every medium priced, or one line naming the missing one
    wanted = " and ".join(o.text for o in objectives)
    first = results[0]
    unaided = [o.without_offload(first) for o in objectives]
    if all(v is not None and v <= o.bound for o, v in zip(objectives, unaided)):
        figures = ", ".join(f"{o.name} {o.show(v)}" for o, v in zip(objectives, unaided))
        return SloAnswer(None, 0.0, f"For {wanted}: the log meets it without offload ({figures}): no tier is needed "
                                    "for it; a tier then only saves prefill compute.")
    meeting = [r for r in results if all(o.met(r) for o in objectives)]
    if meeting:
        best = min(meeting, key=lambda r: (price_of(r), r.size_bytes))
        priced = f" at {price_of(best):,.4g} (the --price units)" if prices else ""
        figures = ", ".join(f"{o.name} {o.show(o.value(best))}" for o in objectives)
        return SloAnswer(best, price_of(best) if prices else math.nan,
                         f"For {wanted}: {best.label} ({format_size(best.size_bytes)}) is the "
                         f"{'cheapest' if prices else 'smallest'} of the {len(meeting)} configuration(s) that meet it"
                         f"{priced}: {figures}.")
    lines = [f"For {wanted}: no configuration tried meets it."]
    for o in objectives:
        if all(o.met(r) for r in results):
            continue
        nearest = (min if o.below else max)(results, key=o.value)
        base = o.without_offload(nearest)
        lines.append(f"{o.name}: the nearest is {nearest.label} at {o.show(o.value(nearest))}"
                     + (f" (without offload {o.show(base)})" if base is not None else "")
                     + f"; {_binding(o, results, nearest, queueing)}.")
    return SloAnswer(None, math.nan, " ".join(lines))


def _binding(o: Objective, results: Sequence[PlanResult], nearest: PlanResult, queueing: float) -> str:
    """What keeps the objective out of reach, read from the sweep (``nearest``: the configuration
    closest to it): the engine's queue, the tiers' size (bigger ones still help), or what the
    tiers cannot change."""
    if o.name == "prefill_saved":
        return "the log's reuse binds: even the largest tiers save no more; only a longer log or more reuse would"
    if queueing > QUEUEING_NOTE:
        return (f"queueing binds: without offload a request's TTFT is {queueing:,.0f}x its prefill alone, so the "
                "engine's capacity (more replicas or a faster device), not the tiers, decides it")
    if len(results) > 1 and nearest is max(results, key=lambda r: r.size_bytes):
        return "tier size may bind: the nearest is the largest configuration tried; try larger tiers"
    return ("the device cache and the tiers' bandwidth bind: larger tiers tried do no better, so what is left is "
            "the prefill of new tokens and the loads' time (a faster tier, or a larger device cache)")
