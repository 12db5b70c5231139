"""Time to first token as a plan predicts it: the log's requests arrive at their times and the
engine's scheduler is replayed step by step with its own rules (vLLM V1's, which the bundled
engine follows), each step priced by the profile (its own cost, its prefill tokens and their
attention, its decoding requests and their contexts).

A step has a budget of ``max_batched_tokens``. Running requests go first, oldest first, each
taking what it has left to compute up to the budget (a decoding request one token). Each takes
device blocks a chunk at a time; when the cache cannot hold a running request's next chunk the
newest running request is preempted: it frees its blocks (last block first, to the tail of the
free queue) and goes back to the front of the queue, to recompute what of its KV has been
reused by then. Only in a step that preempted nobody are waiting requests admitted, in order,
while budget, seats (``max_num_seqs``) and blocks last (minus the watermark while anything
runs); one that does not fit stops the queue, except for requests whose load has landed. A
request with a load from a tier reserves its whole prompt's blocks when admitted; the load
takes ``load_s`` beside the steps, the engine learns it landed at the end of the step it landed
in (with nothing else to run, empty steps of ``idle_step_s``), and it runs from the next step. A
request's first token comes at the end of the step that computes its prompt's last token; it
then decodes its reply a token a step; a server's front end adds ``request_s`` to the wait.

The device's blocks are the engine's (``block_tables``): given each request's prefix keys,
running requests on one system prompt share its blocks, and a hit on a freed block takes it
back from the free queue; without keys, no two requests share a block. A preempted request
comes back to the leading blocks of its own still cached. A request that alone outgrows the cache runs over it
(the engine would refuse such a cache at start). Runs of identical steps (one long prefill
filling every step, or decoding alone) are priced in one go, so a log of long prompts costs
its events, not its steps.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from kvoffload.plan.block_tables import BlockTables
from kvoffload.plan.profile import EngineSpeed
from kvoffload.plan.step_price import largest, steps_time

NEW, LOADING, PREEMPTED, RUNNING, DONE = range(5)


@dataclass(slots=True)
class TtftReplay:
    """Per request, in arrival order: seconds from arrival to first token, when and in which
    step it was first admitted, the step that gave its first token, how often it was
    preempted; and the seconds the engine was busy."""

    ttft: np.ndarray
    started: np.ndarray
    first_step: np.ndarray
    token_step: np.ndarray
    preemptions: np.ndarray
    busy_s: float


def simulate_ttft(arrival: np.ndarray, load_s: np.ndarray, new_tokens: np.ndarray, cached_tokens: np.ndarray,
                  output_tokens: np.ndarray, engine: EngineSpeed, *, block_tokens: int = 16, capacity: int = 0,
                  max_num_seqs: int = 256, watermark: int = 0, after: np.ndarray | None = None,
                  think_s: np.ndarray | None = None,
                  prefix_keys: Sequence[Sequence[Hashable]] | None = None) -> TtftReplay:
    """``capacity``: device blocks of ``block_tokens`` tokens (0: room for everything). With
    ``after`` (the request each one follows, -1: none) and ``think_s``, a request that follows
    another arrives ``think_s`` after that one's last token (a client waiting for its answer),
    not at its logged time. ``prefix_keys``: each request's full prompt blocks' keys (equal
    keys, equal prefixes), for the blocks running requests share."""
    replay = _Replay(arrival, load_s, new_tokens, cached_tokens, output_tokens, engine, block_tokens, capacity,
                     max_num_seqs, watermark, after, think_s, prefix_keys)
    replay.run()
    return TtftReplay(np.array(replay.ttft) + engine.request_s, np.array(replay.started), np.array(replay.first_step),
                      np.array(replay.token_step), np.array(replay.preempts), replay.busy)


class _Replay:
    def __init__(self, arrival: np.ndarray, load_s: np.ndarray, new_tokens: np.ndarray, cached_tokens: np.ndarray,
                 output_tokens: np.ndarray, engine: EngineSpeed, block_tokens: int, capacity: int,
                 max_num_seqs: int, watermark: int, after: np.ndarray | None, think_s: np.ndarray | None,
                 prefix_keys: Sequence[Sequence[Hashable]] | None) -> None:
        n = len(arrival)
        self.eng = engine
        self.arr = [float(a) for a in arrival]
        self.followers: dict[int, list[int]] = {}
        self.arrivals: list[tuple[float, int]] = []
        for i in range(n):
            j = int(after[i]) if after is not None else -1
            if j >= 0:
                self.followers.setdefault(j, []).append(i)
            else:
                self.arrivals.append((self.arr[i], i))
        heapq.heapify(self.arrivals)
        self.thinks = [float(x) for x in think_s] if think_s is not None else [0.0] * n
        self.loads = [float(x) for x in load_s]
        self.cached = [int(c) for c in cached_tokens]
        self.total = [c + max(int(x), 1) for c, x in zip(self.cached, new_tokens)]  # the last prompt token is computed
        self.outputs = [max(int(o), 1) for o in output_tokens]
        self.comp = [0] * n
        self.gen = [0] * n
        self.state = [NEW] * n
        self.ready = [0.0] * n
        self.gave = [0] * n  # a preempted one's blocks that held KV when it was preempted
        self.ttft = [0.0] * n
        self.started = [math.nan] * n
        self.first_step = [-1] * n
        self.token_step = [-1] * n
        self.preempts = [0] * n
        self.bs = block_tokens if capacity > 0 else 0
        self.cap = capacity if capacity > 0 else 1 << 62
        self.tables = BlockTables(self.cap if capacity > 0 else 0, prefix_keys or [()] * n)
        self.hits = [c // self.bs if self.bs else 0 for c in self.cached]  # leading blocks found cached
        self.max_num_seqs = max_num_seqs
        self.watermark = watermark
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.loading: set[int] = set()
        self.busy = 0.0
        self.t = 0.0
        self.step = 0
        self.load_events = 0  # loads sent off or taken back in the step being planned

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs) if self.bs else 0

    @property
    def used(self) -> int:
        return self.tables.used

    def grow(self, i: int, tokens: int) -> int:
        """Blocks ``i`` must add to hold ``tokens`` (a landed load holds its prompt's already)."""
        return max(self.blocks(tokens) - self.tables.held(i), 0)

    def run(self) -> None:
        while self.arrivals or self.waiting or self.running:
            while self.arrivals and self.arrivals[0][0] <= self.t:
                self.waiting.append(heapq.heappop(self.arrivals)[1])
            self.load_events = 0
            takes, changed = self._schedule()
            extra = self.load_events * self.eng.load_step_s
            if not takes:
                if changed:  # a step that only sent loads off (or preempted everyone)
                    self.step += 1
                    self.t += self.eng.idle_step_s + extra
                    continue
                self._idle()
                continue
            k = 1 if changed else self._run_length(takes)
            spent = steps_time(k, takes, self.comp, self.total, self.gen, self.eng) + extra
            self.t += spent
            self.busy += spent
            self.step += k
            self._advance(takes, k)

    def _idle(self) -> None:
        """Nothing to compute: the next request comes (the engine waits for it), or, first, a
        load lands, which the engine learns at the end of the empty step it lands in."""
        arrival, landing = self._next_arrival(), self._next_landing()
        assert min(arrival, landing) < math.inf, "requests wait with nothing running and nothing to come"
        idle = self.eng.idle_step_s
        if landing <= arrival and idle > 0:
            steps = max(math.ceil((landing - self.t) / idle), 1)  # the fewest that reach it
            for _ in range(2):  # float rounding moves the count by one at most; never a loop
                if steps > 1 and self.t + (steps - 1) * idle >= landing:
                    steps -= 1
                elif self.t + steps * idle < landing:
                    steps += 1
            self.t = max(self.t + steps * idle, landing)
            self.step += steps
        else:
            self.t = max(self.t, min(arrival, landing))

    def _next_arrival(self) -> float:
        return self.arrivals[0][0] if self.arrivals else math.inf

    def _next_landing(self) -> float:
        return min((self.ready[i] for i in self.loading if self.ready[i] > self.t), default=math.inf)

    def _take_blocks(self, i: int, n: int) -> None:
        if n:
            self.tables.take(i, n, self.hits[i])

    def _schedule(self) -> tuple[list[tuple[int, int]], bool]:
        """One step's (request, tokens), and whether it preempted or admitted anyone (the next
        step then differs)."""
        budget = self.eng.max_batched_tokens
        takes: list[tuple[int, int]] = []
        running = self.running
        idx = 0
        preempted = False
        while idx < len(running) and budget > 0:
            i = running[idx]
            take = min(self.total[i] - self.comp[i], budget)
            need = self.grow(i, self.comp[i] + take)
            while need > self.cap - self.used and not (len(running) == 1 and self.used == self.tables.held(i)):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim == i:
                    return takes, True
            self._take_blocks(i, need)
            takes.append((i, take))
            budget -= take
            idx += 1
        if preempted or budget <= 0:
            return takes, preempted
        return takes, self._admit(budget, takes)

    def _preempt(self, i: int) -> None:
        self.gave[i] = self.comp[i] // self.bs if self.bs else 0
        self.tables.release(i)
        self.comp[i] = 0
        self.state[i] = PREEMPTED
        self.preempts[i] += 1
        self.waiting.appendleft(i)

    def _admit(self, budget: int, takes: list[tuple[int, int]]) -> bool:
        """The waiting queue's pass; whether anyone was admitted or began a load."""
        waiting = self.waiting
        skipped: list[int] = []
        landed_left = -1
        num_loading = len(self.loading)
        changed = False
        while waiting and budget > 0:
            i = waiting[0]
            landed = self.state[i] == LOADING and self.ready[i] <= self.t
            if (landed_left >= 0 and not landed) or (self.state[i] == LOADING and not landed):
                skipped.append(waiting.popleft())
                continue
            if landed:
                num_loading -= 1
                if landed_left >= 0:
                    landed_left -= 1
            elif len(self.running) + num_loading >= self.max_num_seqs:
                break
            if self.state[i] == NEW:
                self.comp[i] = self.cached[i]
            elif self.state[i] == PREEMPTED:
                self.hits[i] = self.tables.survivors(i, min(self.gave[i], (self.total[i] - 1) // self.bs))
                self.comp[i] = self.hits[i] * self.bs
            load = self.state[i] == NEW and self.loads[i] > 0
            take = 0 if load else min(self.total[i] - self.comp[i], budget)
            grow = self.grow(i, self.total[i] if load else self.comp[i] + take)
            need = self.tables.room(i, grow, self.hits[i]) if self.bs else 0  # shared blocks take no room
            reserve = self.watermark if self.running else 0
            if self.used > 0 and need + reserve > 0 and need + reserve > self.cap - self.used:
                if landed_left < 0:
                    landed_left = sum(1 for j in self.loading if self.ready[j] <= self.t)
                if not landed_left:
                    break
                skipped.append(waiting.popleft())
                continue
            waiting.popleft()
            changed = True
            self._take_blocks(i, grow)
            if self.first_step[i] < 0:
                self.started[i] = self.t
                self.first_step[i] = self.step
            if load:
                self.state[i] = LOADING
                self.ready[i] = self.t + self.loads[i]
                self.loading.add(i)
                num_loading += 1
                self.load_events += 1
                skipped.append(i)
                continue
            if landed:  # taken back
                self.loading.discard(i)
                self.load_events += 1
            self.state[i] = RUNNING
            self.running.append(i)
            takes.append((i, take))
            budget -= take
        waiting.extendleft(reversed(skipped))
        return changed

    def _run_length(self, takes: list[tuple[int, int]]) -> int:
        """How many steps exactly like this one run before anything changes: no prompt
        finishes, no reply ends, no block runs short, nothing arrives or lands."""
        k = 1 << 62
        for i, take in takes:
            left = self.total[i] - self.comp[i]
            if left == 1 and self.gen[i]:  # decoding: until its reply ends
                k = min(k, self.outputs[i] - self.gen[i])
            elif take == left:
                return 1
            else:
                k = min(k, left // take)
        if k > 1 and self.bs and self.used > self.cap:  # only one that alone outgrows the cache
            if self.used != self.tables.held(self.running[0]) or len(self.running) > 1:
                return 1
        elif k > 1 and self.bs:  # a running prompt's next chunks are blocks of its own
            k = largest(k, lambda m: self.used + sum(self.grow(i, self.comp[i] + m * take)
                                                     for i, take in takes) <= self.cap)
        if k > 1:
            gap = min(self._next_arrival(), self._next_landing()) - self.t  # the next request or landed load
            if gap < math.inf:  # the largest k whose last step starts before it
                k = largest(k, lambda m: steps_time(m - 1, takes, self.comp, self.total, self.gen, self.eng) < gap)
        return k

    def _advance(self, takes: list[tuple[int, int]], k: int) -> None:
        """``k`` steps of ``takes`` ran: their blocks, tokens and ends."""
        for i, take in takes:
            if k > 1:
                self._take_blocks(i, self.grow(i, self.comp[i] + k * take))
            decoding = self.total[i] - self.comp[i] == 1 and self.gen[i] > 0
            self.comp[i] += k * take
            if decoding:
                self.gen[i] += k
                self.total[i] += k
            elif self.comp[i] == self.total[i]:  # the prompt's last token: one sampled
                self.gen[i] += 1
                self.total[i] += 1
                if self.gen[i] == 1:
                    self.ttft[i] = self.t - self.arr[i]
                    self.token_step[i] = self.step - 1  # the run's last step
            if self.gen[i] >= self.outputs[i]:
                self._finish(i)

    def _finish(self, i: int) -> None:
        self.running.remove(i)
        self.tables.release(i)
        self.state[i] = DONE
        for j in self.followers.get(i, ()):  # whoever waited for its answer sends next
            self.arr[j] = self.t + self.thinks[j]
            heapq.heappush(self.arrivals, (self.arr[j], j))
