"""The serving benchmark's workloads on the bundled engine, in process (``--engine bundled``).

The same sessions, concurrency, think times and arrival times as over HTTP, driven by one loop
that calls :meth:`LLM.step` itself: a request is submitted when its client is free (and its
think time is over), and each token's time is taken right after the step that produced it, so
TTFT and inter-token latency mean what they mean for a streaming server, without the HTTP and
process hops. The caller resets the engine's caches before each run, as it does a server's.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvoffload.bench.serve_workloads import Session, Workload
from kvoffload.engine.llm import LLM
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.testing.http_client import Completion

#: Idle waits (nothing in flight, next arrival or think time ahead) sleep at most this long.
_IDLE_SLEEP_S = 0.005
#: Seconds without a new token or a finished request before the run is declared stuck (a
#: slow tier's load may take seconds; the steps meanwhile are empty and take microseconds).
_MAX_STALL_S = 300.0
#: A step that produced nothing (every request waits for a load, or a prefill chunk ran)
#: yields the core this long: spinning would take it from the copy threads.
_NO_PROGRESS_SLEEP_S = 0.0005


@dataclass(slots=True)
class _Client:
    """One session in flight: which turn, its history, the request now running."""

    session: Session
    turn: int = 0
    history: list[int] = field(default_factory=list)
    ready_at: float = 0.0
    rid: str | None = None
    prompt: list[int] = field(default_factory=list)
    completion: Completion = field(default_factory=Completion)


def reset_cold(llm: LLM, name: str, reset_connector: bool = True, timeout_s: float = 60.0) -> None:
    """Drop the engine's cached prefixes (and the tiers', with ``reset_connector``) before a run:
    stores still copying when the last request finished hold their device blocks, so empty
    steps run until they have landed."""
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache(reset_connector=reset_connector):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: the prefix cache could not be reset in {timeout_s:g} s (blocks still in use)")
        llm.step()
        time.sleep(_NO_PROGRESS_SLEEP_S)


def run_bundled(llm: LLM, wl: Workload, progress: Any = None,
                hints: bool = False) -> tuple[list[tuple[str, int, Completion]], float]:
    """Run ``wl`` on ``llm``; returns (session id, turn, what the client saw) per request, and the
    wall time. ``hints``: each turn's hint goes with its request, where the workload has them."""
    waiting = deque(sorted(wl.sessions, key=lambda s: s.start_s))
    clients: list[_Client] = []
    results: list[tuple[str, int, Completion]] = []
    t0 = last_progress = time.perf_counter()
    while waiting or clients:
        now = time.perf_counter() - t0
        while waiting and len(clients) < wl.concurrency and waiting[0].start_s <= now:
            s = waiting.popleft()
            clients.append(_Client(s, history=list(s.prefix), ready_at=now + s.think_before(0)))
        for c in clients:
            if c.rid is None and c.ready_at <= now:
                c.prompt = c.session.prompt(c.turn, c.history)
                c.rid = f"{c.session.sid}/{c.turn}"
                c.completion = Completion(start=now)
                llm.add_request(c.prompt, SamplingParams(max_tokens=wl.max_tokens), c.rid,
                                hint=c.session.hint(c.turn) if hints else None)
        if not any(c.rid for c in clients):
            upcoming = [c.ready_at for c in clients] + ([waiting[0].start_s] if waiting else [])
            time.sleep(min(_IDLE_SLEEP_S, max(0.0, min(upcoming) - now)))
            continue
        done = set(llm.step())
        now = time.perf_counter() - t0
        progressed = bool(done)
        for c in list(clients):
            if c.rid is None:
                continue
            times = c.completion.times
            new = len(llm.output_token_ids(c.rid)) - len(times)
            progressed = progressed or new > 0
            times.extend([now - c.completion.start] * new)
            if c.rid not in done:
                continue
            out = llm.collect(c.rid)
            c.completion.tokens = {0: out.token_ids}
            c.completion.finish = {0: out.finish_reason}
            c.completion.status = 200
            c.completion.cached_tokens = out.num_cached_tokens
            results.append((c.session.sid, c.turn, c.completion))
            if progress is not None:
                progress.update(1)
            c.history, c.rid, c.turn = c.prompt + out.token_ids, None, c.turn + 1
            c.ready_at = now + (c.session.think_before(c.turn) if c.turn < len(c.session.turns) else 0.0)
            if c.turn == len(c.session.turns):
                clients.remove(c)
        if progressed:
            last_progress = time.perf_counter()
            continue
        if time.perf_counter() - last_progress > _MAX_STALL_S:
            stuck = sorted(c.rid for c in clients if c.rid)
            raise RuntimeError(f"the engine made no progress for {_MAX_STALL_S:g} s; requests {stuck[:5]}")
        time.sleep(_NO_PROGRESS_SLEEP_S)
    return results, time.perf_counter() - t0
