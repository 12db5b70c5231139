"""What each replica did in one routed run, as the client saw it: the requests each served, the
requests open on each over time (sent, last token not yet back: its queue and its batch), the
prompt tokens each found cached, and the conversations that moved: returning turns served by
another replica than their previous turn (whose KV they then do not find), with their time to
first token against the turns that stayed. A run that loses to round robin shows here whether
it moved turns away from their KV, piled requests on one replica, or neither."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvoffload.testing.http_client import Completion


class RoutedTurn(Protocol):
    sid: str
    turn: int
    completion: Completion


@dataclass(slots=True)
class ReplicaTimeline:
    replicas: list[int]
    requests: dict[int, int]
    #: Prompt tokens each replica reported cached (any tier), summed.
    cached_tokens: dict[int, int]
    returning_ttft_p50_ms: dict[int, float]
    #: Requests open on each replica at the middle of each of ``len(...)`` equal slices of the run.
    in_flight: dict[int, list[int]]
    slice_s: float
    returning: int = 0
    moved: int = 0
    moved_ttft_p50_ms: float = float("nan")
    stayed_ttft_p50_ms: float = float("nan")
    #: Per replica, the returning turns it got from a conversation another replica served before.
    moved_in: dict[int, int] = field(default_factory=dict)
    #: Of the moved turns whose router said what it saw (the gateway's ``explain``): those it
    #: moved although it saw their KV on the replica they left (its load term outweighed the
    #: hit), and those it saw none of there (evicted, or its events not in yet).
    moved_from_kv: int | None = None
    moved_no_kv: int | None = None
    #: The gateway's time to choose a replica (its ``x-kvoffload-route-ms``), part of every
    #: request's time to first token: a router slow to answer slows both replicas' turns alike.
    route_ms_p50: float = float("nan")
    route_ms_max: float = float("nan")

    def as_dict(self) -> dict[str, Any]:
        """For the JSON report: replica ids as keys, no NaN (a figure with no turns is null)."""
        def ms(v: float) -> float | None:
            return None if math.isnan(v) else round(v, 3)
        return {"requests": self.requests, "cached_tokens": self.cached_tokens,
                "returning_ttft_p50_ms": {w: ms(v) for w, v in self.returning_ttft_p50_ms.items()},
                "in_flight": self.in_flight, "slice_s": self.slice_s, "returning": self.returning,
                "moved": self.moved, "moved_ttft_p50_ms": ms(self.moved_ttft_p50_ms),
                "stayed_ttft_p50_ms": ms(self.stayed_ttft_p50_ms), "moved_in": self.moved_in,
                "moved_from_kv": self.moved_from_kv, "moved_no_kv": self.moved_no_kv,
                "route_ms_p50": ms(self.route_ms_p50), "route_ms_max": ms(self.route_ms_max)}

    def lines(self) -> list[str]:
        names = " / ".join(f"r{w}" for w in self.replicas)
        out = [f"requests {names} {' / '.join(str(self.requests[w]) for w in self.replicas)}; cached prompt tokens "
               + ", ".join(f"r{w} {self.cached_tokens[w]:,}" for w in self.replicas)
               + "; returning-turn TTFT p50 " + ", ".join(f"r{w} {self.returning_ttft_p50_ms[w]:.0f} ms"
                                                           for w in self.replicas),
               f"returning turns moved to another replica: {self.moved} of {self.returning} (TTFT p50 "
               f"{self.moved_ttft_p50_ms:.0f} ms moved, {self.stayed_ttft_p50_ms:.0f} ms stayed)"
               + ("" if self.moved_from_kv is None else
                  f"; the router saw their KV on the replica they left for {self.moved_from_kv}, none for "
                  f"{self.moved_no_kv}")
               + ("" if math.isnan(self.route_ms_p50) else
                  f"; choosing took {self.route_ms_p50:.0f} ms (p50), {self.route_ms_max:.0f} ms (max)"),
               f"requests open, every {self.slice_s:.1f} s: " + " | ".join(
                   f"r{w} " + " ".join(str(n) for n in self.in_flight[w]) for w in self.replicas)]
        return out


def _p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3 if values else float("nan")


def timeline(turns: Sequence[RoutedTurn], slices: int = 12) -> ReplicaTimeline | None:
    """The run's replicas as the gateway named them (``Completion.worker``); None when no turn
    names one (a run without a routing gateway)."""
    routed = [t for t in turns if t.completion.worker is not None]
    if not routed:
        return None
    replicas = sorted({t.completion.worker for t in routed if t.completion.worker is not None})
    t0 = min(t.completion.start for t in routed)
    spans = [(t.completion.worker, t.completion.start - t0,
              t.completion.start - t0 + (t.completion.times[-1] if t.completion.times else 0.0)) for t in routed]
    end = max(e for _, _, e in spans)
    slice_s = end / slices if end > 0 else 0.0
    mids = [(k + 0.5) * slice_s for k in range(slices)]
    in_flight = {w: [sum(1 for ww, s, e in spans if ww == w and s <= m < e) for m in mids] for w in replicas}
    prev: dict[str, int] = {}
    moved_ttft, stayed_ttft = [], []
    per_replica_ttft: dict[int, list[float]] = {w: [] for w in replicas}
    moved_in = {w: 0 for w in replicas}
    from_kv = no_kv = 0
    explained = any(t.completion.seen is not None for t in routed)
    routes = [t.completion.route_ms for t in routed if t.completion.route_ms is not None]
    for t in sorted(routed, key=lambda t: (t.sid, t.turn)):
        w, ttft = t.completion.worker, t.completion.ttft
        assert w is not None
        if t.turn > 0 and ttft is not None:
            per_replica_ttft[w].append(ttft)
            if t.sid in prev:
                if prev[t.sid] != w:
                    moved_ttft.append(ttft)
                    moved_in[w] += 1
                    seen = t.completion.seen
                    if seen is not None:
                        if seen.get(prev[t.sid], 0) > 0:
                            from_kv += 1
                        else:
                            no_kv += 1
                else:
                    stayed_ttft.append(ttft)
        prev[t.sid] = w
    return ReplicaTimeline(
        replicas=replicas,
        requests={w: sum(1 for t in routed if t.completion.worker == w) for w in replicas},
        cached_tokens={w: sum(t.completion.cached_tokens or 0 for t in routed if t.completion.worker == w)
                       for w in replicas},
        returning_ttft_p50_ms={w: _p50_ms(v) for w, v in per_replica_ttft.items()},
        in_flight=in_flight, slice_s=slice_s, returning=len(moved_ttft) + len(stayed_ttft), moved=len(moved_ttft),
        moved_ttft_p50_ms=_p50_ms(moved_ttft), stayed_ttft_p50_ms=_p50_ms(stayed_ttft), moved_in=moved_in,
        moved_from_kv=from_kv if explained else None, moved_no_kv=no_kv if explained else None,
        route_ms_p50=statistics.median(routes) if routes else float("nan"),
        route_ms_max=max(routes) if routes else float("nan"))
