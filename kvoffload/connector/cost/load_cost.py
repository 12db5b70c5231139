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
from collections.abc import Sequence
from dataclasses import replace

from kvoffload.connector.cost.load_choice import LoadChoice, LoadDecision, Segment
from kvoffload.connector.cost.measurements import CostMeasurements
from kvoffload.connector.cost.step_batch import StepBatch


class LoadCostModel(CostMeasurements):
    def cancellable(self, medium: str) -> bool:
        """Whether this model may give up loads of ``medium``: tiers it decides for (mode
        ``auto``) that read records (host memory is copied in microseconds), where the engine
        recomputes a failed load."""
        return self.give_up and medium != "CPU" and self.modes.get(medium, "auto") == "auto"
    # ---- the decision --------------------------------------------------------------------
    def choose(self, segments: Sequence[Segment], sync_possible: bool = False, tokens: int = 0,
               batch: StepBatch | None = None) -> LoadChoice:
        """How much of a hit of these runs to load, and whether synchronously (only where the
        engine can: ``sync_possible``). Every rule of how a hit loads is here: ``tokens`` are the
        request's tokens from the hit's first block on (it computes those past the cut), and
        ``batch`` the layer-wise hits already in the step being scheduled, which a measured
        synchronous choice joins only when it delays them less than it gains (``StepBatch``)."""
        choice = self._cut(segments)
        sync = sync_possible and choice.blocks > 0 and self._sync(segments, choice.blocks)
        if (sync and batch is not None and choice.why == "measured"
                and all(self.modes.get(s.medium, "auto") == "auto" for s in segments)
                and not batch.joins(tokens - choice.blocks * self.tokens_per_block, self.prefill)):
            sync = False  # the next step: the hits in this one would wait for its tokens
        return replace(choice, sync=sync)

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
