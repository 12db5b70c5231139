"""LoadCostModel: per request, whether loading a hit beats recomputing it.

A hit is a prefix of offloaded blocks, in runs by tier (``Segment``). Loading a run costs what
that tier's recent load jobs took (``LinearFit`` over blocks per job, per tier); recomputing
its tokens costs what the engine's recent forward passes took per token (``PrefillRate``).
Runs of different tiers load concurrently (each tier has its own copy lanes), so a loaded
prefix costs its slowest tier's time. The model picks the cut that loads the leading runs and
recomputes the rest at the least estimated time: the whole hit, its leading part (a slow
tier's deeper blocks recomputed), or nothing.

Safeguards, since a wrong "recompute" throws away a real hit, and a wrong "load" can cost
more than recomputing:
- jobs in flight (``LoadQueue``): a load's estimate includes the wait behind the tier's loads
  in flight, and a tier whose oldest job runs far past its estimate (judged from its pieces
  read so far) is priced that much slower before the job ends; planned loads now predicted to
  finish later than recomputing their blocks would are given up (``overdue``: the scheduler
  cancels them and they recompute), and so are those queued behind a stalled job, which no
  new load joins;
- warm-up: until a tier has ``warmup_jobs`` timed loads and the engine one timed step, load;
  but no more untimed load jobs in flight per tier than the timings it still needs (host
  memory excepted): a slow tier's first hits would otherwise all queue behind each other
  before the first of them is timed (eight returning chats each queued an 8 s load on a
  2 MB/s disk); hits beyond that recompute that tier's runs;
- hysteresis: a tier keeps its verdict (load or recompute) unless the other side is estimated
  faster by ``margin`` and by ``min_gain_s`` seconds; but a tier that reads records stops
  loading as soon as its loads are estimated slower than recomputing by ``min_gain_s`` (within
  the margin, it recomputes);
- probes: a tier judged too slow is loaded again once ``probe_after_s`` passed without a new
  measurement of it, so a tier that recovered is seen to have recovered; a probe loads only
  the first ``probe_blocks`` of the run (one request pays a small load, not a slow tier's
  whole run), and each probe that finds the tier still too slow doubles the wait for the
  next, up to ``max_probe_after_s``;
- modes: ``layerwise``, ``async``, ``never-recompute`` always load (``auto`` decides).
A load also pays the connector's host work per loaded request (``LoadOverheads``).

A load is synchronous (layer-wise, inside the forward pass of the step that schedules the
request) where the engine allows it, it comes from host memory only, and it is estimated to
take no longer than a step: then it costs at most that step's wait, not a step of waiting in
the queue. Longer loads are asynchronous, so they do not stall every other request of the
batch, and so are loads from tiers that read records (they can fail a check, and a failed
synchronous load costs its step's sampled token; see ``_sync``). Mode ``layerwise`` loads
synchronously always, ``async`` never.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvoffload.connector.cost.cost_fit import LinearFit, PrefillRate
from kvoffload.connector.cost.load_choice import LoadChoice, LoadDecision, Segment
from kvoffload.connector.cost.load_overheads import LoadOverheads
from kvoffload.connector.cost.load_queue import InFlightLoad, LoadQueue


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


class LoadCostModel:
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

    def cancellable(self, medium: str) -> bool:
        """Whether this model may give up loads of ``medium``: tiers it decides for (mode
        ``auto``) that read records (host memory is copied in microseconds), where the engine
        recomputes a failed load."""
        return self.give_up and medium != "CPU" and self.modes.get(medium, "auto") == "auto"

    def load_ended(self, medium: str, job_id: int, seconds: float | None = None) -> None:
        """A load job is over: done in ``seconds``, or failed or cancelled (None)."""
        tier = self._tier(medium)
        load = tier.queue.pop(job_id)
        if seconds is not None:
            self.observe_load(medium, load.blocks if load is not None else 0, seconds,
                              trusted=load is not None and load.overran)

    def end_step(self) -> None:
        """The step's loads were planned: a warm-up load given and not planned was not issued."""
        for tier in self.tiers.values():
            tier.warmup_given = 0

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

    def observe_step(self, tokens: int, seconds: float, sync_blocks: int = 0, sync_wait_s: float = 0.0) -> None:
        """A forward pass of ``tokens`` took ``seconds``; ``sync_blocks`` were loaded inside it
        and it waited ``sync_wait_s`` for them. Such a step prices its layer-wise loads (what
        the step lost to them: its wait for their layers, or its time beyond what a step of
        its size takes without one, whichever is more: copies on the cores the forward pass
        computes on slow it down without it waiting); the prefill rate takes the step less that
        loss (else every layer-wise stall would make recomputing look dearer).

        The time beyond is charged to the loads only up to the copies' own time: a copy slows
        the pass at most by the core time it takes. The rest is the step's own work that a
        step of that many tokens does not show: its new tokens attend to the whole context
        they were loaded for (128 tokens over 1,280 loaded ones took 40 ms past a 128-token
        prefill, against copies of 4.5 ms), which an asynchronous load would pay as well."""
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

    # ---- the decision --------------------------------------------------------------------
    def choose(self, segments: Sequence[Segment], sync_possible: bool = False) -> LoadChoice:
        """How much of a hit of these runs to load, and whether synchronously (only where the
        engine can: ``sync_possible``)."""
        choice = self._cut(segments)
        return replace(choice, sync=sync_possible and choice.blocks > 0 and self._sync(segments, choice.blocks))

    def _sync(self, segments: Sequence[Segment], cut: int) -> bool:
        loaded = self._loaded(segments, cut)
        modes = {self.modes.get(m, "auto") for m in loaded}
        if "async" in modes:
            return False
        if "layerwise" in modes:
            return True
        if set(loaded) != {"CPU"}:
            # A tier that reads records can fail a check; a failed synchronous load costs the
            # token sampled in its step, which vLLM cannot take back from a seeded request's
            # CPU generator (its stream would shift). Such tiers load synchronously only when
            # their mode says layerwise.
            return False
        if self._tier("CPU").loads.samples < self.warmup_jobs or self.step_s <= 0:
            return True  # untimed: host memory is fast enough
        # Layer by layer, the step carrying the load loses what the load costs it; asynchronously
        # the request waits about a step instead. The cost is the copy's time or, once measured,
        # what steps lost to loads that size, whichever is more.
        blocks = loaded["CPU"]
        cost = self._tier("CPU").loads.estimate(blocks)
        if self.sync_stall.samples >= self.warmup_jobs:
            cost = max(cost, self.sync_stall.estimate(blocks))
        if cost <= self.step_s:
            return True
        if self.clock() - self.last_sync_at >= self.probe_after_s:
            self.last_sync_at = self.clock()  # stale: one layer-wise load measures it again
            return True
        return False

    @staticmethod
    def _loaded(segments: Sequence[Segment], cut: int) -> dict[str, int]:
        """Blocks loaded per tier when the hit's first ``cut`` blocks are."""
        per_tier: dict[str, int] = {}
        at = 0
        for s in segments:
            take = min(s.blocks, cut - at)
            if take <= 0:
                break
            per_tier[s.medium] = per_tier.get(s.medium, 0) + take
            at += take
        return per_tier

    def _cut(self, segments: Sequence[Segment]) -> LoadChoice:
        total = sum(s.blocks for s in segments)
        order = list(self.modes)
        slowest = max((s.medium for s in segments), key=lambda m: order.index(m) if m in order else len(order))
        label = slowest.lower()
        # Runs a mode forces to load: the cut cannot be before the last of them.
        forced = 0
        ends = []
        at = 0
        for s in segments:
            at += s.blocks
            ends.append(at)
            if self.modes.get(s.medium, "auto") != "auto":
                forced = at
        if forced == total:
            return LoadChoice(total, LoadDecision.LOAD, False, label, "mode", 0.0, 0.0, 0.0)
        recompute_all = self.prefill.seconds(total * self.tokens_per_block)
        unmeasured = [s.medium for s in segments if self._tier(s.medium).loads.samples < self.warmup_jobs]
        if recompute_all is None or unmeasured:
            cut = self._warm_up(segments, forced)
            return LoadChoice(cut, self._decision(cut, total), False, label, "warm-up", 0.0, recompute_all or 0.0, 0.0)
        cuts = [0, *ends]
        costs = {e: self._cost(segments, e, total) for e in cuts if e >= forced}
        best = min(costs, key=lambda e: (costs[e], -e))
        kept = self._consistent_cut(segments, forced)
        why = "measured"
        if best != kept and not (costs[best] * (1 + self.margin) < costs[kept]
                                 and costs[kept] - costs[best] > self.min_gain_s) \
                and not (best < kept and self._reads_records(segments, best, kept)
                         and costs[kept] - costs[best] > self.min_gain_s):
            best = kept  # not clearly better: keep each tier's verdict (no flapping)
        probe = self._probe(segments, best)
        if probe is not None:
            best, why = probe, "probe"
        else:
            self._record_verdicts(segments, best)
        chosen = costs[best] if best in costs else self._cost(segments, best, total)
        return LoadChoice(best, self._decision(best, total), False, label, why, costs[total], recompute_all, chosen)

    @staticmethod
    def _reads_records(segments: Sequence[Segment], lo: int, hi: int) -> bool:
        """Whether the hit's blocks ``lo:hi`` all come from tiers that read records (not host
        memory). Loading them is kept only while it is estimated no slower than recomputing by
        more than ``min_gain_s``: within the margin such a tier recomputes (its time varies with
        its load, and a load that runs late also holds the tier for the loads behind it); going
        back to loading them still needs the margin, so the verdict does not flap."""
        at = 0
        for s in segments:
            if at < hi and at + s.blocks > lo and s.medium == "CPU":
                return False
            at += s.blocks
        return True

    @staticmethod
    def _decision(cut: int, total: int) -> LoadDecision:
        return LoadDecision.LOAD if cut == total else LoadDecision.RECOMPUTE if cut == 0 else LoadDecision.PARTIAL

    def _warm_up(self, segments: Sequence[Segment], forced: int) -> int:
        """Before the timings exist: load up to the first run of a tier judged too slow, or (host
        memory excepted) one with as many loads out as it needs timings; count the loads given."""
        cut = 0
        for s in segments:
            tier = self._tier(s.medium)
            needed = self.warmup_jobs - tier.loads.samples
            timing = s.medium != "CPU" and 0 < needed <= len(tier.queue.loads) + tier.warmup_given
            if cut >= forced and (tier.verdict is False or timing):
                break
            cut += s.blocks
        for medium in self._loaded(segments, cut):
            self._tier(medium).warmup_given += 1
        return cut

    def _cost(self, segments: Sequence[Segment], cut: int, total: int) -> float:
        """Estimated seconds to load the hit's first ``cut`` blocks and recompute the rest; a
        load adds the host work of loading a request, which every request of its step waits
        for (``LoadOverheads``)."""
        per_tier = self._loaded(segments, cut)
        load = max((self._load_s(m, n) for m, n in per_tier.items()), default=0.0)
        if per_tier:
            load += self.overheads.host_cost_s()
        recompute = self.prefill.seconds((total - cut) * self.tokens_per_block) or 0.0
        return load + recompute

    def _load_s(self, medium: str, blocks: int) -> float:
        """A new load's time: the wait behind the tier's loads in flight, then its own, both at
        the slowdown the tier's running job has shown."""
        tier = self._tier(medium)
        slowdown = tier.queue.slowdown()
        if self.give_up and tier.queue.stalled() and self.cancellable(medium):
            return math.inf  # it would queue behind a stalled job, and be given up before it begins
        own = tier.loads.estimate(blocks) * slowdown
        if tier.floor:
            own = max(own, tier.floor * (self.prefill.seconds(blocks * self.tokens_per_block) or 0.0))
        return tier.queue.wait_s(slowdown) + own

    def _consistent_cut(self, segments: Sequence[Segment], forced: int) -> int:
        """The cut each tier's last verdict asks for: load up to the first run of a tier judged
        too slow (a tier never judged loads)."""
        at = 0
        for s in segments:
            if at >= forced and self._tier(s.medium).verdict is False:
                return at
            at += s.blocks
        return at

    def _probe(self, segments: Sequence[Segment], cut: int) -> int | None:
        """Load the head of a recomputed tier's run once its last measurement is stale."""
        now = self.clock()
        at = 0
        for s in segments:
            if at + s.blocks > cut:
                tier = self._tier(s.medium)
                if now - tier.last_load_at < tier.probe_after_s:
                    return None
                tier.last_load_at = now  # one probe per period, even if its load never lands
                tier.probe_after_s = min(2 * tier.probe_after_s, self.max_probe_after_s)
                return cut + min(at + s.blocks - cut, self.probe_blocks)
            at += s.blocks
        return None

    def _record_verdicts(self, segments: Sequence[Segment], cut: int) -> None:
        loaded = self._loaded(segments, cut)
        for s in segments:
            tier = self._tier(s.medium)
            tier.verdict = s.medium in loaded
            if tier.verdict:
                tier.probe_after_s = self.probe_after_s  # loaded on its measurements: probes start over

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
                if self.sync_stall.samples else {}}
