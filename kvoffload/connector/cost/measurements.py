"""CostMeasurements: what the load-cost model knows, as measured: each tier's load jobs (their
time by size, those in flight and how far they have read), the engine's forward passes (its
prefill rate and what layer-wise loads cost a step), and the host work a loaded request adds.
``LoadCostModel`` (load_cost.py) decides from them; this half only keeps them current.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvoffload.connector.cost.cost_fit import LinearFit, PrefillRate
from kvoffload.connector.cost.load_overheads import LoadOverheads
from kvoffload.connector.cost.load_queue import InFlightLoad, LoadQueue
from kvoffload.connector.cost.step_cadence import StepCadence


@dataclass(slots=True)
class TierCost:
    loads: LinearFit = field(default_factory=LinearFit)
    last_load_at: float = 0.0
    #: The last verdict: True load, False recompute, None never judged.
    verdict: bool | None = None
    #: Load jobs from this tier planned and not yet reported, and warm-up loads given this step
    #: and not planned yet (``end_step`` forgets those that never were).
    queue: LoadQueue = field(default_factory=LoadQueue)
    warmup_given: int = 0
    #: Seconds from a measurement to the next probe (doubles while probes find it slow).
    probe_after_s: float = 0.0
    #: Since a load of this tier was given up and until one completes: its loads cost at least
    #: this many times recomputing their tokens (what the given-up job had read, over the
    #: recompute estimate it was judged against). The job had not finished, so that ratio is a
    #: lower bound; kept relative, an engine that slows later does not make the tier look fast.
    floor: float = 0.0


class CostMeasurements:
    def __init__(self, modes: Mapping[str, str], tokens_per_block: int, bytes_per_block: int,
                 clock: Callable[[], float] = time.monotonic, warmup_jobs: int = 3, margin: float = 0.25,
                 min_gain_s: float = 0.002, probe_after_s: float = 30.0, probe_blocks: int = 8,
                 max_probe_after_s: float = 300.0, give_up: bool = True) -> None:
        #: Load mode by medium, in tier order (fastest first).
        self.modes = dict(modes)
        self.tokens_per_block = tokens_per_block
        self.bytes_per_block = bytes_per_block
        self.clock = clock
        self.warmup_jobs = warmup_jobs
        self.margin = margin
        self.min_gain_s = min_gain_s
        self.probe_after_s = probe_after_s
        self.probe_blocks = probe_blocks
        self.max_probe_after_s = max(probe_after_s, max_probe_after_s)
        #: Loads may be given up (the engine recomputes a failed load, not fails its request).
        self.give_up = give_up
        self.tiers: dict[str, TierCost] = {m: self._new_tier() for m in self.modes}
        self.prefill = PrefillRate()
        #: A forward pass's time, exponentially averaged (0 before the first).
        self.step_s = 0.0
        #: What steps lost to the layer-wise loads inside them, by blocks loaded.
        self.sync_stall = LinearFit()
        #: When a step with a layer-wise load last reported (the stall's last measurement).
        self.last_sync_at = clock()
        self.overheads = LoadOverheads()
        self.cadence = StepCadence(clock)

    # ---- measurements --------------------------------------------------------------------
    def _new_tier(self) -> TierCost:
        return TierCost(probe_after_s=self.probe_after_s)

    def _tier(self, medium: str) -> TierCost:
        tier = self.tiers.get(medium)
        return tier if tier is not None else self.tiers.setdefault(medium, self._new_tier())

    def load_planned(self, medium: str, job_id: int, blocks: int, cancellable: bool) -> None:
        """A load job of ``blocks`` from ``medium`` was planned; ``cancellable``: it may be given
        up if it comes to cost more than recomputing (an asynchronous load of a tier in mode
        ``auto`` that reads records)."""
        tier = self._tier(medium)
        latency, per_block = tier.loads.coefficients()
        own = latency + per_block * blocks if tier.loads.samples >= self.warmup_jobs else None
        if own is None and tier.warmup_given:
            tier.warmup_given -= 1  # a warm-up load given this step, now planned: counted once
        budget = self.prefill.seconds(blocks * self.tokens_per_block) if cancellable else None
        if budget is not None:
            budget = budget * (1 + self.margin) + self.min_gain_s
        tier.queue.add(job_id, InFlightLoad(blocks, own, budget, latency_s=latency if own is not None else 0.0))

    def load_ended(self, medium: str, job_id: int, seconds: float | None = None) -> None:
        """A load job is over: done in ``seconds``, or failed or cancelled (None)."""
        tier = self._tier(medium)
        load = tier.queue.pop(job_id)
        if seconds is not None:
            self.observe_load(medium, load.blocks if load is not None else 0, seconds,
                              trusted=load is not None and load.overran)

    def end_step(self, requests: int = 1, tokens: int = 0, loads_sent: int = 0) -> None:
        """The step's loads were planned, for a step of ``requests`` requests (each waits for the
        host work a load adds) computing ``tokens`` and sending ``loads_sent`` loads off: a
        warm-up load given and not planned was not issued."""
        self.overheads.observe_batch(requests)
        self.cadence.step(tokens, loads_sent, sum(len(t.queue.loads) for t in self.tiers.values()))
        for tier in self.tiers.values():
            tier.warmup_given = 0

    def observe_plan(self, seconds: float) -> None:
        """The scheduler half spent ``seconds`` of host time planning one request's load."""
        self.overheads.observe_host("scheduler", 1, seconds)

    def observe_load(self, medium: str, blocks: int, seconds: float, trusted: bool = False) -> None:
        tier = self._tier(medium)
        tier.loads.add(blocks, seconds, trusted)
        tier.last_load_at = self.clock()
        tier.floor = 0.0  # a load that finished: the tier is measured again

    def load_reading(self, medium: str, job_id: int, seconds: float, done: float = 0.0, piece: float = 1.0,
                     piece_s: float | None = None) -> None:
        """A worker reports a load job of ``medium`` has been reading for ``seconds`` and has
        read the share ``done`` of it, in pieces of ``piece``, the one in progress for ``piece_s``."""
        self._tier(medium).queue.reading(job_id, seconds, done, piece, piece_s)

    def overdue(self) -> list[int]:
        """Cancellable load jobs now predicted to finish later than recomputing their blocks
        from here would; each counts as evidence of its tier's speed (it ran this long at least)."""
        out = []
        for tier in self.tiers.values():
            if not tier.queue.loads:
                continue  # nothing in flight (most steps)
            head = next(iter(tier.queue.loads.items()), None)
            given_up = tier.queue.overdue(tier.queue.slowdown())
            if head is not None and head[0] in given_up:
                # It read past what recomputing would have taken: the tier is not what its fit says.
                # What it read is all that is known of it now, and a lower bound: the give-up is a
                # verdict that holds until a load of the tier completes (a probe). The fit restarts
                # at what it read; the floor keeps it dearer than recomputing by what it read, and at
                # least by the margin its budget had (the prefill estimate may have risen since): an
                # engine that slows later raises both sides, and no tie turns into "faster to load".
                blocks, read_s = head[1].blocks, head[1].read_s
                tier.loads.restart(blocks, read_s)
                recompute_s = self.prefill.seconds(blocks * self.tokens_per_block)
                if recompute_s:
                    tier.floor = max(read_s / recompute_s, 1.0 + self.margin)
                tier.loads.samples = max(tier.loads.samples, self.warmup_jobs)  # measured: no more warm-up
                tier.last_load_at = self.clock()
                tier.verdict = False
            out += given_up
        return out

    def observe_step(self, tokens: int, seconds: float, sync_blocks: int = 0, sync_wait_s: float = 0.0,
                     load_requests: int = 0, load_host_s: float = 0.0) -> None:
        """A forward pass of ``tokens`` took ``seconds``; ``sync_blocks`` were loaded inside it
        and it waited ``sync_wait_s`` for them; the worker spent ``load_host_s`` of host time
        issuing the loads of ``load_requests`` requests. Such a step prices its layer-wise loads (what
        the step lost to them: its wait for their layers, or its time beyond what a step of
        its size takes without one, whichever is more: copies on the cores the forward pass
        computes on slow it down without it waiting); the prefill rate takes the step less that
        loss (else every layer-wise stall would make recomputing look dearer).

        The time beyond is charged to the loads only up to the copies' own time: a copy slows
        the pass at most by the core time it takes. The rest is the step's own work that a
        step of that many tokens does not show: its new tokens attend to the whole context
        they were loaded for (128 tokens over 1,280 loaded ones took 40 ms past a 128-token
        prefill, against copies of 4.5 ms), which an asynchronous load would pay as well."""
        self.overheads.observe_host("worker", load_requests, load_host_s)
        lost = 0.0
        if sync_blocks:
            expected = self.prefill.seconds(tokens)  # None before any step was timed
            beyond = 0.0 if expected is None else seconds - expected
            host = self.tiers.get("CPU")
            if host is not None and host.loads.samples:
                beyond = min(beyond, host.loads.estimate(sync_blocks))
            lost = min(seconds, max(0.0, sync_wait_s, beyond))
            self.sync_stall.add(sync_blocks, lost)
            self.last_sync_at = self.clock()
        self.prefill.add(tokens, seconds - lost)
        if seconds > 0:
            self.step_s = seconds if self.step_s == 0 else self.step_s + 0.1 * (seconds - self.step_s)
    # ---- reports ---------------------------------------------------------------------------
    def gauges(self) -> dict[str, dict[str, float]]:
        """Measured throughputs (per-job latency included), by tier (lower case) and step bucket."""
        rate: dict[str, float] = {}
        latency: dict[str, float] = {}
        for medium, tier in self.tiers.items():
            if tier.loads.samples:
                latency[medium.lower()] = tier.loads.coefficients()[0]
                rate[medium.lower()] = self.bytes_per_block * tier.loads.units_per_second()
        return {"kvoffload_tier_load_bytes_per_second": rate,
                "kvoffload_tier_load_latency_seconds": latency,
                "kvoffload_prefill_tokens_per_second": self.prefill.tokens_per_second(),
                "kvoffload_layerwise_stall_seconds": dict(zip(("per_step", "per_block"), self.sync_stall.coefficients()))
                if self.sync_stall.samples else {},
                "kvoffload_step_overhead_seconds": self.cadence.gauges()}
