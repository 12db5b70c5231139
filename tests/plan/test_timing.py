"""The TTFT model: hand-priced cases, and the batched runs of identical steps against a plain
step-by-step simulation of the same rules (Hypothesis)."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.plan.profile import EngineSpeed
from kvoffload.plan.timing import simulate_ttft

ENGINE = EngineSpeed("t", step_s=1e-3, token_s=1e-5, attention_s=1e-8, max_batched_tokens=256, decode_s=2e-4,
                     decode_context_s=1e-7)


def one(n: int, cached: int = 0, load: float = 0.0, out: int = 1) -> float:
    ttft, _, _ = simulate_ttft(np.array([0.0]), np.array([load]), np.array([n]), np.array([cached]), np.array([out]),
                            ENGINE)
    return float(ttft[0])


def test_a_lone_prompt_is_its_steps():
    # 600 tokens: steps of 256, 256, 88; attention over what came before in each.
    expect = 3e-3 + 600 * 1e-5 + 1e-8 * (256 * 128 + 256 * (256 + 128) + 88 * (512 + 44))
    assert one(600) == pytest.approx(expect)
    assert one(1, cached=1000) == pytest.approx(1e-3 + 1e-5 + 1e-8 * (1000 + 0.5))


def test_a_load_runs_beside_the_steps_and_its_prefill_after():
    assert one(1, cached=1000, load=0.01) == pytest.approx(0.01 + one(1, cached=1000))


def test_two_prompts_share_steps_first_come_first_served():
    ttft, started, busy = simulate_ttft(np.array([0.0, 0.0]), np.zeros(2), np.array([200, 200]), np.zeros(2, dtype=int),
                                  np.array([1, 1]), ENGINE)
    first = 1e-3 + 256 * 1e-5 + 1e-8 * (200 * 100 + 56 * 28)  # 200 of the first, 56 of the second
    assert ttft[0] == pytest.approx(first) and started.tolist() == [0.0, 0.0]
    assert ttft[1] == pytest.approx(first + 1e-3 + 144 * 1e-5 + 1e-8 * 144 * (56 + 72)) == pytest.approx(busy)


def test_a_prompt_that_does_not_fit_waits_for_the_device():
    arrival, zeros, new = np.zeros(2), np.zeros(2, dtype=int), np.array([100, 100])
    need = np.array([8, 8])
    alone, _, _ = simulate_ttft(arrival, np.zeros(2), new, zeros, np.array([5, 1]), ENGINE, need, capacity=10)
    shared, _, _ = simulate_ttft(arrival, np.zeros(2), new, zeros, np.array([5, 1]), ENGINE, need, capacity=16)
    # With room for one, the second starts after the first's last token (4 decode steps on).
    assert shared[1] == pytest.approx(shared[0]) and alone[1] > alone[0] + 4 * 1e-3


def reference(arrival, load, new, cached, out, eng, max_num_seqs=256, need=None, cap=1 << 62, after=None,
              think=None):
    """Step by step, the rules as the module docstring states them."""
    n = len(arrival)
    arrival = [float(a) for a in arrival]
    after = [-1] * n if after is None else list(after)
    pending = sorted((arrival[i], i) for i in range(n) if after[i] < 0)
    left = [max(int(x), 1) for x in new]
    comp = [int(c) for c in cached]
    ttft, ready, started = [0.0] * n, [0.0] * n, [math.nan] * n
    waiting, decoding, ctx = [], [], {}
    t, step, prefilling, used = 0.0, 0, 0, 0
    need = [0] * n if need is None else list(need)

    def finish(i):
        for j in range(n):
            if after[j] == i:
                arrival[j] = t + think[j]
                pending.append((arrival[j], j))
                pending.sort()

    while pending or waiting or decoding:
        while decoding and decoding[0][0] <= step:
            i = heapq.heappop(decoding)[1]
            ctx.pop(i)
            used -= need[i]
            finish(i)
        while pending and pending[0][0] <= t:
            i = pending.pop(0)[1]
            ready[i] = t + load[i]
            waiting.append(i)
        room = eng.max_batched_tokens - len(decoding)
        slots = max_num_seqs - len(decoding) - prefilling
        takes = []
        blocked = False
        for i in waiting:
            if room <= 0:
                break
            if ready[i] > t:
                continue
            if math.isnan(started[i]):
                if blocked or slots <= 0 or (used + need[i] > cap and used > 0):
                    blocked = True
                    continue
                used += need[i]
                slots -= 1
                prefilling += 1
                started[i] = t
            take = min(left[i], room)
            takes.append((i, take))
            room -= take
        if not takes and not decoding:
            upcoming = [a for a, _ in pending[:1]] + [ready[i] for i in waiting if ready[i] > t]
            if not upcoming:
                break
            t = max(t, min(upcoming))
            continue
        context = sum(c + (step - s) for s, c in ctx.values())
        t += (eng.step_s + sum(k for _, k in takes) * eng.token_s + len(decoding) * eng.decode_s
              + sum(k * (comp[i] + k / 2) for i, k in takes) * eng.attention_s + context * eng.decode_context_s)
        step += 1
        for i, k in takes:
            left[i] -= k
            comp[i] += k
            if left[i] == 0:
                waiting.remove(i)
                prefilling -= 1
                ttft[i] = t - arrival[i]
                if out[i] > 1:
                    heapq.heappush(decoding, (step + out[i] - 1, i))
                    ctx[i] = (step, comp[i] + 1)
                else:
                    used -= need[i]
                    finish(i)
    return ttft, started


requests = st.lists(st.tuples(st.floats(0, 0.5), st.sampled_from([0.0, 0.0, 0.003, 0.02]), st.integers(1, 2000),
                              st.integers(0, 3000), st.integers(1, 40)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(requests, st.integers(1, 6), st.sampled_from([0, 40, 150]), st.data())
def test_batched_steps_price_exactly_what_single_steps_do(reqs, seqs, capacity, data):
    reqs = sorted(reqs)
    cols = [np.array(c) for c in zip(*reqs)]
    arrival, load, new, cached, out = cols
    need = (new + cached) // 16 + 1
    # Some requests wait for an earlier one's answer (a session's next turn), a think time after it.
    after = np.array([data.draw(st.integers(-1, i - 1)) if i else -1 for i in range(len(reqs))])
    think = np.array([data.draw(st.floats(0, 0.05)) for _ in reqs])
    got, got_started, _ = simulate_ttft(arrival, load, new, cached, out, ENGINE, need, capacity, max_num_seqs=seqs,
                                        after=after, think_s=think)
    want, want_started = reference(arrival, load, new, cached, out, ENGINE, seqs, need if capacity else None,
                                   capacity or 1 << 62, after, think)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert np.allclose(got_started, want_started, rtol=1e-9, atol=1e-12, equal_nan=True)


def test_a_turn_that_waits_for_its_answer_comes_after_it():
    # The second request follows the first: sent 0.1 s after the first's last token, whatever
    # the log's timestamp said.
    ttft, started, _ = simulate_ttft(np.array([0.0, 0.05]), np.zeros(2), np.array([100, 100]), np.array([0, 100]),
                                     np.array([3, 1]), ENGINE, after=np.array([-1, 0]), think_s=np.array([0.0, 0.1]))
    first = 1e-3 + 100 * 1e-5 + 1e-8 * 100 * 50
    decode = 2 * (1e-3 + 2e-4) + 1e-7 * (101 + 102)  # two more tokens, over contexts of 101 and 102
    assert started[1] == pytest.approx(first + decode + 0.1)
    assert ttft[1] == pytest.approx(1e-3 + 100 * 1e-5 + 1e-8 * 100 * (100 + 50))
