"""One run of a serving workload over HTTP, and its record: what ``bench serve`` measures on
one server (or one gateway in front of several) per repetition."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from kvoffload.bench.serve_workloads import Workload, in_rounds
from kvoffload.testing.http_client import Completion, stream_completion
from kvoffload.testing.vllm_server import VllmServer


@dataclass(slots=True)
class TurnResult:
    sid: str
    turn: int
    completion: Completion


@dataclass(slots=True)
class RunResult:
    config: str
    turns: list[TurnResult]
    wall_s: float
    hits: dict[str, float] = field(default_factory=dict)
    #: Routed runs: per replica, its prefix hit tokens by tier and the requests it served.
    replicas: list[dict[str, float]] = field(default_factory=list)
    #: How the load cost model served hits ("tier decision" -> requests), where it ran.
    decisions: dict[str, float] = field(default_factory=dict)

    def ttfts(self, returning: bool = False) -> list[float]:
        return [t.completion.ttft for t in self.turns if t.completion.ttft is not None and (t.turn > 0 or not returning)]

    def figures(self) -> dict[str, float]:
        all_t, ret = self.ttfts(), self.ttfts(returning=True)
        itl = [x for t in self.turns for x in t.completion.inter_token]
        out_tokens = sum(len(v) for t in self.turns for v in t.completion.tokens.values())
        figs = {"ttft_p50_ms": _pct(all_t, 50) * 1e3, "ttft_p95_ms": _pct(all_t, 95) * 1e3,
                "ttft_p99_ms": _pct(all_t, 99) * 1e3, "itl_mean_ms": (statistics.fmean(itl) * 1e3 if itl else 0.0),
                "req_per_s": len(self.turns) / self.wall_s, "out_tok_per_s": out_tokens / self.wall_s}
        if ret:
            figs.update(ret_ttft_p50_ms=_pct(ret, 50) * 1e3, ret_ttft_p95_ms=_pct(ret, 95) * 1e3)
        return figs


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


async def run_workload(url: str, model: str, wl: Workload, progress: Any = None,
                       hints: bool = False) -> tuple[list[TurnResult], float]:
    """``hints``: send each turn's hint (``kv_transfer_params``), where the workload has them."""
    import aiohttp

    results: list[TurnResult] = []
    gate = asyncio.Semaphore(wl.concurrency)
    t0 = time.perf_counter()

    async def session(s: Any, http: Any) -> None:
        delay = s.start_s - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            history = list(s.prefix)
            for i in range(len(s.turns)):
                if s.think_before(i):
                    await asyncio.sleep(s.think_before(i))
                prompt = s.prompt(i, history)
                hint = s.hint(i) if hints else None
                c = await stream_completion(http, url, model, prompt, wl.max_tokens,
                                            kv_transfer_params=None if hint is None else {"kvoffload": hint},
                                            user=s.sid)
                results.append(TurnResult(s.sid, i, c))
                if progress is not None:
                    progress.update(1)
                if not c.ok:
                    return
                history = prompt + c.tokens.get(0, [])

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=wl.concurrency + 4)) as http:
        await asyncio.gather(*(session(s, http) for s in wl.sessions))
    return results, time.perf_counter() - t0


def run_http(url: str, model: str, wl: Workload, progress: Any = None,
             hints: bool = False) -> tuple[list[TurnResult], float]:
    """``run_workload`` to its end; a workload of rounds, round by round (``in_rounds``)."""
    if not wl.rounds:
        return asyncio.run(run_workload(url, model, wl, progress, hints))

    def one_round(sub: Workload) -> tuple[list[tuple[str, int, Completion]], float]:
        done, seconds = asyncio.run(run_workload(url, model, sub, progress, hints))
        return [(t.sid, t.turn, t.completion) for t in done], seconds

    rounds, wall = in_rounds(wl, one_round)
    return [TurnResult(*r) for r in rounds], wall


#: One scrape of a server's ``/metrics`` (``VllmServer.metrics``): the readers below share it.
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def hit_tokens(m: Metrics) -> dict[str, float]:
    hits = {dict(labels).get("tier", "?"): v for (name, labels), v in m.items() if name == "kvoffload_hit_tokens_total"}
    hits["device"] = m.get(("vllm:prefix_cache_hits_total", ()), 0.0)
    return hits


def load_decisions(m: Metrics) -> dict[str, float]:
    """kvoffload's load decisions so far, as "tier decision" (``cpu layerwise``) -> requests."""
    return {f"{dict(labels).get('tier', '?')} {dict(labels).get('decision', '?')}": v
            for (name, labels), v in m.items() if name == "kvoffload_load_decisions_total"}


def requests_served(m: Metrics) -> float:
    """Requests the server finished, whatever their finish reason (vLLM's counter)."""
    return sum(v for (name, _), v in m.items() if name == "vllm:request_success_total")


def preemptions(m: Metrics) -> float:
    """Requests the server preempted (vLLM's counter): each gives its blocks back and is
    prefilled again later, which a routed run that slows down everywhere may show."""
    return sum(v for (name, _), v in m.items() if name == "vllm:num_preemptions_total")


def decode_seconds(m: Metrics) -> float:
    """Seconds the server's requests spent decoding, summed (vLLM's histogram): the same run's
    figure on two replicas differs when one computed slower (its core shared), not its routing."""
    return sum(v for (name, _), v in m.items() if name == "vllm:request_decode_time_seconds_sum")


def reset_caches(server: VllmServer, external: bool) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.post(f"/reset_prefix_cache?reset_external={'true' if external else 'false'}").get("success"):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{server.url}: the prefix cache could not be reset (requests still running?)")


def run_once(name: str, server: VllmServer, wl: Workload, progress: Any, hints: bool = False) -> RunResult:
    reset_caches(server, external=True)  # every run starts cold: no tier holds the workload's blocks
    start = server.metrics()
    before, decided = hit_tokens(start), load_decisions(start)
    turns, wall = run_http(server.url, server.model, wl, progress, hints)
    time.sleep(1.5)  # counters reach /metrics with the engine's next stats report
    end = server.metrics()
    after = hit_tokens(end)
    decisions = {k: v - decided.get(k, 0) for k, v in load_decisions(end).items() if v > decided.get(k, 0)}
    return RunResult(name, turns, wall, {k: after.get(k, 0) - before.get(k, 0) for k in after}, decisions=decisions)


def tokens_by_turn(run: RunResult) -> dict[tuple[str, int], list[int]]:
    return {(t.sid, t.turn): t.completion.tokens.get(0, []) for t in run.turns if t.completion.ok}


__all__ = ["Metrics", "RunResult", "TurnResult", "decode_seconds", "hit_tokens", "load_decisions", "preemptions",
           "requests_served", "reset_caches", "run_http", "run_once", "run_workload", "tokens_by_turn"]
