"""Time to first token as a plan predicts it: the log's requests arrive at their times and an
engine runs steps of at most ``max_batched_tokens`` tokens, each costing ``step_s`` plus its
tokens (the profile's prefill speed); each decoding request adds ``decode_s`` to a step. A request's
prefill starts once its load has landed (loads run beside the steps, from arrival), first come
first served among those ready; its first token comes at the end of the step that finishes it.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from kvoffload.plan.profile import EngineSpeed


def simulate_ttft(arrival: np.ndarray, ready: np.ndarray, new_tokens: np.ndarray, cached_tokens: np.ndarray,
                  output_tokens: np.ndarray, engine: EngineSpeed, kv_blocks: np.ndarray | None = None,
                  capacity: int = 0, max_num_seqs: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Seconds from each request's arrival to its first token, and the time its prefill was
    first scheduled (arrays in arrival order). With ``capacity`` (device blocks), a request
    holds ``kv_blocks`` of them from its first step to its last token, and one that does not fit
    waits, with every request behind it (as the engine's scheduler does)."""
    n = len(arrival)
    ttft = np.zeros(n)
    started = np.full(n, np.nan)
    budget = engine.max_batched_tokens
    left = np.maximum(new_tokens, 1).astype(np.int64)  # the last prompt token is always computed
    done_prefill = np.zeros(n, dtype=np.int64)
    waiting: deque[int] = deque()
    decoding: list[tuple[int, int]] = []  # (step it finishes at, request)
    need = kv_blocks if kv_blocks is not None and capacity > 0 else np.zeros(n, dtype=np.int64)
    cap = capacity if capacity > 0 else 1 << 62
    used = prefilling = 0
    nxt = 0
    t = 0.0
    step = 0
    while nxt < n or waiting or decoding:
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        while decoding and decoding[0][0] <= step:
            used -= int(need[heapq.heappop(decoding)[1]])
        decodes = len(decoding)
        tokens = 0
        attention = 0.0
        finished: list[int] = []
        room = budget - decodes
        slots = max_num_seqs - len(decoding) - prefilling
        full = False
        for i in list(waiting):
            if room <= 0:
                break
            if ready[i] > t:
                continue
            if np.isnan(started[i]):
                if full or slots <= 0 or (used + int(need[i]) > cap and used > 0):
                    full = True  # no room: it waits, and so do the new ones after it
                    continue
                used += int(need[i])
                slots -= 1
                prefilling += 1
                started[i] = t
            take = min(int(left[i]), room)
            c = int(cached_tokens[i] + done_prefill[i])
            attention += take * (c + take / 2)
            left[i] -= take
            done_prefill[i] += take
            room -= take
            tokens += take
            if left[i] == 0:
                finished.append(i)
                waiting.remove(i)
                prefilling -= 1
        if tokens == 0 and decodes == 0:
            # Nothing to run: jump to the next arrival or landed load.
            upcoming = [arrival[nxt]] if nxt < n else []
            upcoming += [ready[i] for i in waiting if ready[i] > t]
            if not upcoming:  # the last decodes just ended
                assert not waiting, "requests wait with nothing running and nothing to come"
                break
            t = max(t, float(min(upcoming)))
            continue
        t += engine.step_s + tokens * engine.token_s + decodes * engine.decode_s + attention * engine.attention_s
        step += 1
        for i in finished:
            ttft[i] = t - arrival[i]
            if output_tokens[i] > 1:
                heapq.heappush(decoding, (step + int(output_tokens[i]) - 1, i))
            else:
                used -= int(need[i])
    return ttft, started
