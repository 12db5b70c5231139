"""Hints for a trace replay, derived from what a caller knows when it sends each request.

``honest_hints`` reads a request's own fields only: its session and how it ended. An agent
whose request ended in a tool call (``tool_use``) runs the tool and comes back with the same
context; one whose request carries no stop reason has not ended its turn either (only
``end_turn`` does), so both announce a return within ``TOOL_RETURN_S``; after ``end_turn`` the
return is unknown (a person types the next turn, or never does). Nothing reads a later
request: not its time, not the think time before it. ``oracle_hints`` announce each session's
true next request time instead: the bound honest hints chase.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.offload.hints import BlockHint, RequestHint
from kvoffload.traces import TraceRequest

#: What an agent framework expects a tool step to take (WEKA's Claude Code sessions: a median
#: of ~10 s from a tool call to the next request; a caller with its own measure uses that).
TOOL_RETURN_S = 10.0
#: Stop reasons after which the agent continues by itself.
CONTINUES = frozenset({"tool_use", ""})
#: The oracle's "never back": later than any trace ends.
NEVER_S = 1e9


def honest_hints(requests: Sequence[TraceRequest]) -> list[BlockHint]:
    return [RequestHint(r.session, TOOL_RETURN_S if r.stop in CONTINUES else None).at(r.t) for r in requests]


def oracle_hints(requests: Sequence[TraceRequest]) -> list[BlockHint]:
    """Each session's true next request time (none after its last: never back)."""
    out: list[BlockHint] = []
    following: dict[str, float] = {}
    for r in reversed(requests):
        nxt = following.get(r.session)
        out.append(BlockHint(r.session, r.t + NEVER_S if nxt is None else nxt, 0, None, r.t))
        following[r.session] = r.t
    out.reverse()
    return out


#: What ``derive`` takes: no hints, what each caller knew, each session's true next return.
MODES = ("none", "honest", "oracle")


def derive(requests: Sequence[TraceRequest], mode: str) -> list[BlockHint] | None:
    """One of ``MODES``."""
    if mode == "none":
        return None
    if mode == "honest":
        return honest_hints(requests)
    if mode == "oracle":
        return oracle_hints(requests)
    raise ValueError(f"hints {mode!r}: use none, honest or oracle (as POLICY@MODE, e.g. hinted@honest)")
