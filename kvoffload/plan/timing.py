"""Time to first token as a plan predicts it: the log's requests arrive at their times and an
engine runs steps of at most ``max_batched_tokens`` tokens, each priced by the profile (its own
cost, its prefill tokens and their attention, its decoding requests and their contexts). A
request's load is sent at the first step's start after it arrives and runs beside the steps;
its prefill runs in the first step after the load has landed, first come first served among
those ready; its first token comes at the end of the step that finishes it, and it then
decodes its reply a token a step.

A request holds its prompt's device blocks from its first step to its last token; a new one
whose prompt does not fit waits, and so does every new one behind it (the engine's scheduler
stops there too; it admits by chunks and preempts when running requests outgrow the device,
which this does not model). Runs of identical steps (one long prefill filling every step, or
decoding alone) are priced in one go, so a log of long prompts costs its events, not its steps.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from kvoffload.plan.profile import EngineSpeed


def simulate_ttft(arrival: np.ndarray, load_s: np.ndarray, new_tokens: np.ndarray, cached_tokens: np.ndarray,
                  output_tokens: np.ndarray, engine: EngineSpeed, kv_blocks: np.ndarray | None = None,
                  capacity: int = 0, max_num_seqs: int = 256, after: np.ndarray | None = None,
                  think_s: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Seconds from each request's arrival to its first token, the time its prefill was first
    scheduled (arrays in arrival order), and the seconds the engine was busy. With
    ``capacity`` (device blocks), a request holds ``kv_blocks`` of them from its first step to
    its last token, and one that does not fit waits, with every new one behind it. With
    ``after`` (the request each one follows, -1: none) and ``think_s``, a request that follows
    another arrives ``think_s`` after that one's last token (a client waiting for its answer),
    not at its logged time."""
    n = len(arrival)
    arr = [float(a) for a in arrival]
    followers: dict[int, list[int]] = {}
    arrivals: list[tuple[float, int]] = []
    for i in range(n):
        j = int(after[i]) if after is not None else -1
        if j >= 0:
            followers.setdefault(j, []).append(i)
        else:
            arrivals.append((arr[i], i))
    heapq.heapify(arrivals)
    thinks = [float(x) for x in think_s] if think_s is not None else [0.0] * n
    loads = [float(x) for x in load_s]
    left = [max(int(x), 1) for x in new_tokens]  # the last prompt token is always computed
    computed = [int(c) for c in cached_tokens]  # tokens each request has in KV
    outputs = [int(o) for o in output_tokens]
    ttft = [0.0] * n
    started = [math.nan] * n
    ready = [0.0] * n
    budget = engine.max_batched_tokens
    waiting: deque[int] = deque()
    landing: list[tuple[float, int]] = []  # (when, request) of loads still on their way
    decoding: list[tuple[int, int]] = []  # (step it finishes at, request)
    # The decoding requests' contexts grow a token a step: their sum is
    # ctx_base + decodes * step.
    ctx_base = 0
    ctx_of: dict[int, int] = {}
    need = [int(b) for b in kv_blocks] if kv_blocks is not None and capacity > 0 else [0] * n
    cap = capacity if capacity > 0 else 1 << 62
    used = prefilling = 0
    busy = 0.0
    t = 0.0
    step = 0

    def done(i: int) -> None:  # its last token: whoever waited for it sends next
        for j in followers.get(i, ()):
            arr[j] = t + thinks[j]
            heapq.heappush(arrivals, (arr[j], j))

    while arrivals or waiting or decoding:
        while decoding and decoding[0][0] <= step:
            _, i = heapq.heappop(decoding)
            ctx_base -= ctx_of.pop(i)
            used -= need[i]
            done(i)
        while arrivals and arrivals[0][0] <= t:
            _, i = heapq.heappop(arrivals)
            ready[i] = t + loads[i]
            if ready[i] > t:
                heapq.heappush(landing, (ready[i], i))
            waiting.append(i)
        while landing and landing[0][0] <= t:
            heapq.heappop(landing)
        decodes = len(decoding)
        room = budget - decodes
        slots = max_num_seqs - decodes - prefilling
        takes: list[tuple[int, int]] = []
        full = False
        unseen = prefilling  # started prefills not visited yet: past the last, only new ones wait
        for i in waiting:
            if room <= 0 or (full and unseen == 0):
                break
            if ready[i] > t:
                continue
            if started[i] != started[i]:  # not started: NaN
                if full or slots <= 0 or (used + need[i] > cap and used > 0):
                    full = True  # no room: it waits, and so do the new ones after it
                    continue
                used += need[i]
                slots -= 1
                prefilling += 1
                started[i] = t
            else:
                unseen -= 1
            take = min(left[i], room)
            takes.append((i, take))
            room -= take
        if not takes and decodes == 0:
            # Nothing to run: jump to the next arrival or landed load.
            upcoming = [arrivals[0][0]] if arrivals else []
            if landing:
                upcoming.append(landing[0][0])
            if not upcoming:  # the last decodes just ended
                assert not waiting, "requests wait with nothing running and nothing to come"
                break
            t = max(t, min(upcoming))
            continue
        # How many steps exactly like this one can run before anything changes: none finishes
        # its prefill, no decode ends, nothing arrives or lands.
        k = 1
        lone = len(takes) == 1 and left[takes[0][0]] > takes[0][1] and room == 0
        if (lone or not takes) and decodes:
            k = decoding[0][0] - step
        elif lone:
            k = 1 << 62
        if lone:
            k = min(k, (left[takes[0][0]] - 1) // takes[0][1])
        if k > 1:
            bound = [arrivals[0][0]] if arrivals else []
            if landing:
                bound.append(landing[0][0])
            if bound:  # the largest k whose last step starts before the first of them
                gap = min(bound) - t
                lo, hi = 1, k
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if _steps_time(mid - 1, takes, computed, decodes, ctx_base, step, engine) < gap:
                        lo = mid
                    else:
                        hi = mid - 1
                k = lo
        spent = _steps_time(k, takes, computed, decodes, ctx_base, step, engine)
        t += spent
        busy += spent
        step += k
        for i, take in takes:
            left[i] -= k * take
            computed[i] += k * take
            if left[i] == 0:
                waiting.remove(i)
                prefilling -= 1
                ttft[i] = t - arr[i]
                if outputs[i] > 1:
                    heapq.heappush(decoding, (step + outputs[i] - 1, i))
                    ctx_of[i] = computed[i] + 1 - step
                    ctx_base += ctx_of[i]
                else:
                    used -= need[i]
                    done(i)
    return np.array(ttft), np.array(started), busy


def _steps_time(k: int, takes: list[tuple[int, int]], computed: list[int], decodes: int, ctx_base: int, step: int,
                engine: EngineSpeed) -> float:
    """Seconds of ``k`` steps of this composition (the prefill's context and the decodes'
    contexts growing each step)."""
    tokens = sum(take for _, take in takes)
    attention = 0.0
    for i, take in takes:  # sum over j < k of take * (c + j * take + take / 2)
        c = computed[i]
        attention += take * k * (c + take / 2) + take * take * k * (k - 1) / 2
    context = k * ctx_base + decodes * (k * step + k * (k - 1) / 2)
    return (k * (engine.step_s + tokens * engine.token_s + decodes * engine.decode_s)
            + attention * engine.attention_s + context * engine.decode_context_s)
