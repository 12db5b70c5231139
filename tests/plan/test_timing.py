"""The TTFT model: hand-priced cases, and the batched runs of identical steps against a plain
step-by-step simulation of the same rules (Hypothesis)."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.plan.free_queue import FreeQueue
from kvoffload.plan.profile import EngineSpeed
from kvoffload.plan.timing import simulate_ttft

ENGINE = EngineSpeed("t", step_s=1e-3, token_s=1e-5, attention_s=1e-8, max_batched_tokens=256, decode_s=2e-4,
                     decode_context_s=1e-7)


def one(n: int, cached: int = 0, load: float = 0.0, out: int = 1) -> float:
    replay = simulate_ttft(np.array([0.0]), np.array([load]), np.array([n]), np.array([cached]), np.array([out]),
                           ENGINE)
    return float(replay.ttft[0])


def test_a_lone_prompt_is_its_steps():
    # 600 tokens: steps of 256, 256, 88; attention over what came before in each.
    expect = 3e-3 + 600 * 1e-5 + 1e-8 * (256 * 128 + 256 * (256 + 128) + 88 * (512 + 44))
    assert one(600) == pytest.approx(expect)
    assert one(1, cached=1000) == pytest.approx(1e-3 + 1e-5 + 1e-8 * (1000 + 0.5))


def test_a_load_runs_beside_the_steps_and_its_prefill_after():
    assert one(1, cached=1000, load=0.01) == pytest.approx(0.01 + one(1, cached=1000))


def test_a_servers_front_end_adds_to_every_first_token():
    eng = dataclasses.replace(ENGINE, request_s=0.015)
    r = simulate_ttft(np.zeros(1), np.zeros(1), np.array([600]), np.zeros(1, dtype=int), np.ones(1, dtype=int), eng)
    assert r.ttft[0] == pytest.approx(one(600) + 0.015)


def test_an_idle_engine_learns_of_a_landed_load_at_an_empty_steps_end():
    # The step that sends the 1 ms load off, then empty steps of 0.4 ms until one ends after
    # it landed (at 0.4 + 0.4 + 0.4 = 1.2 ms, three empty steps in all), then its prefill.
    eng = dataclasses.replace(ENGINE, idle_step_s=4e-4)
    r = simulate_ttft(np.zeros(1), np.array([1e-3]), np.array([1]), np.array([1000]), np.ones(1, dtype=int), eng)
    assert r.ttft[0] == pytest.approx(0.4e-3 + 2 * 0.4e-3 + one(1, cached=1000)) and r.token_step[0] == 3


def test_two_prompts_share_steps_first_come_first_served():
    r = simulate_ttft(np.array([0.0, 0.0]), np.zeros(2), np.array([200, 200]), np.zeros(2, dtype=int),
                      np.array([1, 1]), ENGINE)
    first = 1e-3 + 256 * 1e-5 + 1e-8 * (200 * 100 + 56 * 28)  # 200 of the first, 56 of the second
    assert r.ttft[0] == pytest.approx(first) and r.started.tolist() == [0.0, 0.0]
    assert r.ttft[1] == pytest.approx(first + 1e-3 + 144 * 1e-5 + 1e-8 * 144 * (56 + 72)) == pytest.approx(r.busy_s)
    assert r.first_step.tolist() == [0, 0] and r.token_step.tolist() == [0, 1]


def test_a_prompt_waits_for_blocks_a_chunk_at_a_time():
    # Blocks of 16 tokens. The first prompt (100 tokens, 7 blocks) then 4 decode steps; the
    # second needs 7 more: with 10 blocks it waits for the first's last token, with 16 not.
    arrival, zeros, new = np.zeros(2), np.zeros(2, dtype=int), np.array([100, 100])
    alone = simulate_ttft(arrival, np.zeros(2), new, zeros, np.array([5, 1]), ENGINE, capacity=10)
    shared = simulate_ttft(arrival, np.zeros(2), new, zeros, np.array([5, 1]), ENGINE, capacity=16)
    assert shared.ttft[1] == pytest.approx(shared.ttft[0]) and alone.ttft[1] > alone.ttft[0] + 4 * 1e-3
    assert alone.first_step.tolist() == [0, 5] and alone.preemptions.tolist() == [0, 0]


def test_the_newest_running_request_is_preempted_when_blocks_run_out():
    # Two 32-token prompts (2 blocks each) in 5 blocks: both start; the first decode step needs
    # a third block for each (token 33): the second is preempted, recomputes after the first ends.
    r = simulate_ttft(np.zeros(2), np.zeros(2), np.array([32, 32]), np.zeros(2, dtype=int), np.array([3, 3]),
                      ENGINE, capacity=5)
    assert r.first_step.tolist() == [0, 0] and r.preemptions.tolist() == [0, 1]
    assert r.token_step.tolist() == [0, 0]  # its first token came before it was preempted
    # Chunked admission: a 600-token prompt (38 blocks) starts beside a 100-token one (7) in 20
    # blocks, with the 156 tokens of budget left (10 blocks), not all of its prompt's.
    r = simulate_ttft(np.zeros(2), np.zeros(2), np.array([100, 600]), np.zeros(2, dtype=int), np.array([1, 1]),
                      ENGINE, capacity=20)
    assert r.first_step.tolist() == [0, 0] and r.preemptions.tolist() == [0, 0]


def test_a_preempted_request_finds_what_is_left_of_its_blocks():
    q = FreeQueue(4)  # positions 0-3 free
    q.take(3)  # three fresh blocks go
    first = q.give(5)  # a preempted request's five blocks, its last first: positions 4-8
    q.take(2)  # position 3, then its last block (position 4)
    assert q.survivors(first, 5, 10) == 4 and q.survivors(first, 5, 2) == 2
    q.reclaim(first, 5, 4)  # it takes its four back from the middle
    q.give(1)  # position 9
    q.take(1)
    assert q.head == 10  # the reclaimed positions 5-8 were skipped


def reference(arrival, load, new, cached, out, eng, seqs=256, bs=16, cap=0, watermark=0, after=None, think=None):
    """One step at a time, the rules as the module docstring states them, with the free queue
    as real blocks: a preempted request's are tagged (request, preemption, index)."""
    n = len(arrival)
    arrival = [float(a) for a in arrival]
    after = [-1] * n if after is None else list(after)
    pending = sorted((arrival[i], i) for i in range(n) if after[i] < 0)
    total = [int(c) + max(int(x), 1) for c, x in zip(cached, new)]
    comp, gen, held, preempts = [0] * n, [0] * n, [0] * n, [0] * n
    state = ["new"] * n
    ttft, ready, started = [0.0] * n, [0.0] * n, [math.nan] * n
    first_step, token_step, full_at_preemption = [-1] * n, [-1] * n, [0] * n
    limit = cap if cap else 1 << 62
    free = deque([None] * cap)
    waiting, running = deque(), []
    t, step, used = 0.0, 0, 0

    def blocks(tokens):
        return -(-tokens // bs) if cap else 0

    def take_fresh(i, k):
        nonlocal used
        held[i] += k
        used += k
        for _ in range(k):
            if free:
                free.popleft()

    def give(i, tag):
        nonlocal used
        used -= held[i]
        free.extend([(i, preempts[i], j) for j in reversed(range(held[i]))] if tag else [None] * held[i])
        held[i] = 0

    def finish(i):
        running.remove(i)
        give(i, False)
        state[i] = "done"
        for j in range(n):
            if after[j] == i:
                arrival[j] = t + think[j]
                pending.append((arrival[j], j))
                pending.sort()

    while pending or waiting or running:
        while pending and pending[0][0] <= t:
            waiting.append(pending.pop(0)[1])
        budget, takes, preempted, changed, events = eng.max_batched_tokens, [], False, False, 0
        idx = 0
        while idx < len(running) and budget > 0:
            i = running[idx]
            k = min(total[i] - comp[i], budget)
            need = max(blocks(comp[i] + k) - held[i], 0)
            while need > limit - used and not (len(running) == 1 and used == held[i]):
                v = running.pop()
                preempts[v] += 1
                full_at_preemption[v] = comp[v] // bs
                give(v, True)
                comp[v] = 0
                state[v] = "preempted"
                waiting.appendleft(v)
                preempted = changed = True
                if v == i:
                    break
            if preempted and i not in running:
                break
            take_fresh(i, need)
            takes.append((i, k))
            budget -= k
            idx += 1
        if not preempted and budget > 0:
            loading = sum(1 for i in range(n) if state[i] == "loading")
            landed_left, skipped = -1, []
            while waiting and budget > 0:
                i = waiting[0]
                landed = state[i] == "loading" and ready[i] <= t
                if (landed_left >= 0 and not landed) or (state[i] == "loading" and not landed):
                    skipped.append(waiting.popleft())
                    continue
                if landed:
                    loading -= 1
                    landed_left -= landed_left >= 0
                elif len(running) + loading >= seqs:
                    break
                kept = []
                if state[i] == "new":
                    comp[i] = int(cached[i])
                elif state[i] == "preempted":
                    most = min(full_at_preemption[i], (total[i] - 1) // bs)
                    while len(kept) < most and (i, preempts[i], len(kept)) in free:
                        kept.append((i, preempts[i], len(kept)))
                    comp[i] = len(kept) * bs
                is_load = state[i] == "new" and load[i] > 0
                k = 0 if is_load else min(total[i] - comp[i], budget)
                need = max(blocks(total[i] if is_load else comp[i] + k) - held[i], 0)
                reserve = watermark if running else 0
                if used > 0 and need + reserve > 0 and need + reserve > limit - used:
                    if landed_left < 0:
                        landed_left = sum(1 for j in waiting if state[j] == "loading" and ready[j] <= t)
                    if not landed_left:
                        break
                    skipped.append(waiting.popleft())
                    continue
                waiting.popleft()
                changed = True
                for tag in kept:
                    free.remove(tag)
                held[i] += len(kept)
                used += len(kept)
                take_fresh(i, need - len(kept))
                if first_step[i] < 0:
                    started[i], first_step[i] = t, step
                events += is_load or landed  # a load sent off, or one taken back
                if is_load:
                    state[i], ready[i] = "loading", t + load[i]
                    loading += 1
                    skipped.append(i)
                    continue
                state[i] = "running"
                running.append(i)
                takes.append((i, k))
                budget -= k
            waiting.extendleft(reversed(skipped))
        if not takes:
            if changed:
                step += 1
                t += eng.idle_step_s + events * eng.load_step_s
                continue
            arriving = pending[0][0] if pending else math.inf
            landing = min([ready[i] for i in waiting if state[i] == "loading" and ready[i] > t], default=math.inf)
            if landing <= arriving and eng.idle_step_s:  # empty steps until the one it lands in
                steps = 1
                while t + steps * eng.idle_step_s < landing:
                    steps += 1
                t, step = t + steps * eng.idle_step_s, step + steps
            else:
                t = max(t, min(arriving, landing))
            continue
        dec = [(i, k) for i, k in takes if total[i] - comp[i] == 1 and gen[i]]
        pre = [(i, k) for i, k in takes if (i, k) not in dec]
        t += (eng.step_s + sum(k for _, k in pre) * eng.token_s + len(dec) * eng.decode_s
              + sum(k * (comp[i] + k / 2) for i, k in pre) * eng.attention_s
              + sum(comp[i] + 1 for i, _ in dec) * eng.decode_context_s + events * eng.load_step_s)
        step += 1
        for i, k in takes:
            comp[i] += k
            if comp[i] == total[i]:
                gen[i] += 1
                total[i] += 1
                if gen[i] == 1:
                    ttft[i], token_step[i] = t - arrival[i], step - 1
            if gen[i] >= max(int(out[i]), 1):
                finish(i)
    return ttft, started, first_step, token_step, preempts


requests = st.lists(st.tuples(st.floats(0, 0.5), st.sampled_from([0.0, 0.0, 0.003, 0.02]), st.integers(1, 2000),
                              st.integers(0, 3000), st.integers(1, 40)), min_size=1, max_size=12)


@settings(max_examples=400, deadline=None)
@given(requests, st.integers(1, 6), st.sampled_from([0, 12, 40, 150, 400]), st.sampled_from([0, 0, 3]),
       st.sampled_from([0.0, 4e-4]), st.data())
def test_batched_steps_price_exactly_what_single_steps_do(reqs, seqs, capacity, watermark, idle, data):
    reqs = sorted(reqs)
    cols = [np.array(c) for c in zip(*reqs)]
    arrival, load, new, cached, out = cols
    # Some requests wait for an earlier one's answer (a session's next turn), a think time after it.
    after = np.array([data.draw(st.integers(-1, i - 1)) if i else -1 for i in range(len(reqs))])
    think = np.array([data.draw(st.floats(0, 0.05)) for _ in reqs])
    # Costs that are no round decimals: with round ones a load can land exactly when a step
    # starts (20 steps of 1 ms), a tie that float rounding decides one way in a batched sum and
    # the other in a running one.
    eng = dataclasses.replace(ENGINE, step_s=1e-3 * math.sqrt(1.07), token_s=1e-5 * math.sqrt(0.93),
                              decode_s=2e-4 * math.sqrt(1.1), decode_context_s=1e-7 * math.sqrt(0.97),
                              idle_step_s=idle * math.sqrt(1.03), load_step_s=idle * math.sqrt(0.9))
    got = simulate_ttft(arrival, load, new, cached, out, eng, capacity=capacity, max_num_seqs=seqs,
                        watermark=watermark, after=after, think_s=think)
    want = reference(arrival, load, new, cached, out, eng, seqs, 16, capacity, watermark, after, think)
    assert got.ttft == pytest.approx(want[0], rel=1e-9, abs=1e-12)
    assert np.allclose(got.started, want[1], rtol=1e-9, atol=1e-12, equal_nan=True)
    assert (got.first_step.tolist(), got.token_step.tolist(), got.preemptions.tolist()) == tuple(want[2:])


def test_a_turn_that_waits_for_its_answer_comes_after_it():
    # The second request follows the first: sent 0.1 s after the first's last token, whatever
    # the log's timestamp said.
    r = simulate_ttft(np.array([0.0, 0.05]), np.zeros(2), np.array([100, 100]), np.array([0, 100]), np.array([3, 1]),
                      ENGINE, after=np.array([-1, 0]), think_s=np.array([0.0, 0.1]))
    ttft, started = r.ttft, r.started
    first = 1e-3 + 100 * 1e-5 + 1e-8 * 100 * 50
    decode = 2 * (1e-3 + 2e-4) + 1e-7 * (101 + 102)  # two more tokens, over contexts of 101 and 102
    assert started[1] == pytest.approx(first + decode + 0.1)
    assert ttft[1] == pytest.approx(1e-3 + 100 * 1e-5 + 1e-8 * 100 * (100 + 50))
