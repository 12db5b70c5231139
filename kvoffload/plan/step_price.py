"""What a run of identical engine steps costs, as the profile prices it: the timing replay
prices runs of steps at once (and finds how long a run may be) with these."""

from __future__ import annotations

from collections.abc import Callable

from kvoffload.plan.profile import EngineSpeed


def largest(k: int, fits: Callable[[int], bool]) -> int:
    """The largest m in [1, k] with ``fits(m)`` (true at 1, monotone)."""
    lo, hi = 1, k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def steps_time(k: int, takes: list[tuple[int, int]], comp: list[int], total: list[int], gen: list[int],
                engine: EngineSpeed) -> float:
    """Seconds of ``k`` steps of this composition (prefill contexts and decoding contexts
    growing each step). A request decodes when one token is left and it has answered before."""
    tokens = decodes = 0
    attention = context = 0.0
    for i, take in takes:
        c = comp[i]
        if total[i] - c == 1 and gen[i]:
            decodes += 1
            context += k * (c + 1)
        else:  # sum over j < k of take * (c + j * take + take / 2)
            tokens += take
            attention += take * k * (c + take / 2) + take * take * k * (k - 1) / 2
    context += decodes * k * (k - 1) / 2
    return (k * (engine.step_s + tokens * engine.token_s + decodes * engine.decode_s)
            + attention * engine.attention_s + context * engine.decode_context_s)
