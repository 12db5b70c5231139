"""LoadPlanner: how many of a request's prompt tokens the tiers hold, and the loads that bring
them into the device blocks the engine allocated.

A hit is the longest run every KV-cache group can serve: full-attention groups need the whole
prefix, sliding-window groups only the window ending at the hit (all or nothing). A run split
over tiers loads as one job per tier segment; blocks loaded from a slower tier are stored into
the CPU tier again from the device (promotion). How much of a hit is loaded, and whether inside
the step that schedules the request (synchronously, layer by layer) or before it, is the load
cost model's call (``LoadCostModel``); the rest of the hit is recomputed.
"""

from __future__ import annotations

import logging
import time
from typing import cast

from kvoffload.connector.base import EngineRequest
from kvoffload.connector.cost.load_choice import LoadChoice, LoadDecision, Segment
from kvoffload.connector.cost.load_cost import LoadCostModel
from kvoffload.connector.group_keys import NULL_BLOCK_ID, GroupGeometry
from kvoffload.connector.jobs import JobKind
from kvoffload.connector.scheduler.hint_relay import HintRelay
from kvoffload.connector.scheduler.request_state import RequestOffloadState
from kvoffload.connector.scheduler.reset_guard import ResetGuard
from kvoffload.connector.scheduler.scheduler_records import Planner, SchedulerRecords
from kvoffload.connector.scheduler.scheduler_stats import SchedulerSideStats
from kvoffload.offload.abstract import BlockHash, LookupResult, Medium
from kvoffload.offload.chain import TierChain
from kvoffload.offload.mediums import GPULoadStoreSpec

logger = logging.getLogger(__name__)


class LoadPlanner(Planner):
    def __init__(self, records: SchedulerRecords, manager: TierChain, groups: GroupGeometry,
                 stats: SchedulerSideStats, reset_guard: ResetGuard, cost: LoadCostModel, hints: HintRelay) -> None:
        super().__init__(records, manager, groups, stats, reset_guard)
        #: Decides, per hit, how much of it to load (the rest is recomputed).
        self.cost = cost
        #: Gives a request's hint with the blocks its first lookup touches.
        self.hints = hints

    def hit_tokens(self, request: EngineRequest, state: RequestOffloadState,
                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens past the engine's own ``num_computed_tokens`` the tiers can load (None: ask
        again next step), as the engine's ``get_num_new_matched_tokens`` answers."""
        records, groups = self.records, self.groups
        size = records.offloaded_block_size
        num_blocks = request.num_tokens // size
        hashes = records.offload_hashes(request, 0, num_blocks)
        if not state.touched:
            state.touched = True
            useful = groups.useful_keys(hashes)  # a sliding group: the window a hit at the end needs
            for keys in useful:
                self.manager.touch(keys)
            self.hints.looked_up(request, state, useful)
        start = num_computed_tokens // size
        state.found = None
        state.sync_answer = False
        if start >= len(hashes):
            return 0, False
        self.stats.lookups += 1
        end = len(hashes)
        found_media: dict[BlockHash, Medium] = {}
        for g in groups.full_groups:
            keys = groups.keys(hashes[start:end], g)
            found = self.manager.lookup_prefix(keys)
            found_media.update(zip(keys, found.media))
            if found.stop is LookupResult.RETRY:
                return None, False
            if found.stop is LookupResult.HIT_PENDING:
                # The next block's store is still in flight: wait a step for it rather than
                # recompute it (hit counts then do not depend on copy timing).
                self.stats.lookups_deferred += 1
                return None, False
            end = start + found.hits
        if groups.sliding_groups:
            sliding_end = self._sliding_hit_end(hashes, start, end, found_media)
            if sliding_end is None:
                return None, False
            end = sliding_end
        if end <= start:
            return 0, False
        decided = self._decide(request, state, hashes, start, end, found_media)
        if decided is None:
            return None, False
        end, sync = decided
        if end <= start:
            return 0, False
        num_hit_tokens = end * size - num_computed_tokens
        if num_hit_tokens <= 0:
            return 0, False
        loads = self._group_loads(hashes[start:end], start, end)
        if not all(records.blocks_being_loaded.isdisjoint(keys) for _, keys in loads):
            self.stats.lookups_deferred += 1
            return None, False  # another request is loading these blocks: ask again later
        state.found = found_media
        state.sync_answer = sync
        return num_hit_tokens, not sync

    def _decide(self, request: EngineRequest, state: RequestOffloadState, hashes: list[BlockHash], start: int,
                end: int, found_media: dict[BlockHash, Medium]) -> tuple[int, bool] | None:
        """Where the hit [start, end) should end (the cost model's cut), and whether it loads
        synchronously (None: ask again). Only a one-group model loads synchronously (vLLM's
        recovery from a failed synchronous load handles one group), and only a hit that leaves
        the engine a token to compute."""
        groups = self.groups
        if not groups.full_groups:
            return end, False
        keys = groups.keys(hashes[start:end], groups.full_groups[0])
        segments: list[Segment] = []
        for key in keys:
            medium = str(found_media.get(key, Medium.CPU))
            if segments and segments[-1].medium == medium:
                segments[-1] = Segment(medium, segments[-1].blocks + 1)
            else:
                segments.append(Segment(medium, 1))
        sync_possible = groups.num_groups == 1 and end * self.records.offloaded_block_size < request.num_tokens
        choice = self.cost.choose(segments, sync_possible, request.num_tokens - start * self.records.offloaded_block_size,
                                  self.records.next_step.batch)
        cut = start + choice.blocks
        if cut < end and groups.sliding_groups:
            sliding_end = self._sliding_hit_end(hashes, start, cut, found_media)
            if sliding_end is None:
                return None
            cut = sliding_end
        self._count(request.request_id, state, choice, end - start)
        return cut, choice.sync

    def _count(self, rid: str, state: RequestOffloadState, choice: LoadChoice, blocks: int) -> None:
        if state.decision_counted:
            return
        state.decision_counted = True
        label = choice.decision.value
        if choice.decision is LoadDecision.LOAD:
            label = "layerwise" if choice.sync else "async"
        self.stats.load_decisions[(choice.tier, label)] += 1
        if choice.decision is not LoadDecision.RECOMPUTE and 0 < choice.chosen_s < choice.recompute_s:
            self.stats.estimated_saved_seconds += choice.recompute_s - choice.chosen_s
        logger.debug("kvoffload: request %s: hit of %d blocks reaching %s: %s %d of them (%s; estimated load %.2f ms, "
                     "recompute %.2f ms, chosen %.2f ms)", rid, blocks, choice.tier, label,
                     choice.blocks, choice.why, choice.load_s * 1e3, choice.recompute_s * 1e3, choice.chosen_s * 1e3)

    def _sliding_hit_end(self, hashes: list[BlockHash], start: int, end: int,
                         found_media: dict[BlockHash, Medium]) -> int | None:
        """The longest hit end <= ``end`` whose window every sliding group holds (all or
        nothing: a group missing a block shortens the hit for every group). None: ask again.
        The tier of each key found goes into ``found_media``."""
        groups = self.groups
        while end > start:
            for g in groups.sliding_groups:
                first = max(start, groups.first_needed(g, end))
                keys = groups.keys(hashes[first:end], g)
                lookup = self.manager.lookup_prefix(keys)
                if lookup.stop is LookupResult.RETRY:
                    return None
                found_media.update(zip(keys, lookup.media))
                found = lookup.hits
                if first + found < end:
                    # Block first + found is missing: every end past it has it in its window
                    # (windows only move right as the end does), so the next candidate ends there.
                    end = first + found
                    break
            else:
                return end
        return end

    def _group_loads(self, hashes: list[BlockHash], start: int, end: int) -> list[tuple[int, list[BlockHash]]]:
        """(first offloaded block, keys) each group loads for a hit of [start, end)."""
        groups = self.groups
        out = []
        for g in range(groups.num_groups):
            first = max(start, groups.first_needed(g, end))
            out.append((first, groups.keys(hashes[first - start : end - start], g)))
        return out

    def plan(self, request: EngineRequest, state: RequestOffloadState, num_local: int, num_external: int) -> None:
        """The loads of ``num_external`` tokens after ``num_local`` local hits, into the blocks
        the engine allocated (``state.block_ids``)."""
        t0 = time.perf_counter()
        records = self.records
        rid = request.request_id
        size, block_size, f = records.offloaded_block_size, records.block_size, records.factor
        full_tokens = num_local + num_external
        if full_tokens % size or num_external % block_size:
            raise AssertionError(
                f"request {rid}: {num_local} local + {num_external} external tokens do not end on "
                f"an offloaded block boundary ({size})"
            )
        start = num_local // size
        end = full_tokens // size
        hashes = records.offload_hashes(request, start, end)
        jobs = []
        first_engine = num_local // block_size
        promote_from = end
        loading: list[BlockHash] = []
        found, state.found = state.found or {}, None
        for g, (offset, keys) in enumerate(self._group_loads(hashes, start, end)):
            block_ids = state.block_ids[g]
            media = [found.get(k) for k in keys]
            known = None if None in media else cast("list[Medium]", media)
            records.events.describe(request, g, enumerate(keys, offset))
            for spec, seg_keys in self.manager.prepare_load_segments(keys, known):
                lo = max(offset * f, first_engine)
                hi = (offset + len(seg_keys)) * f
                while lo < hi and block_ids[lo] == NULL_BLOCK_ID:
                    lo += 1  # left of a sliding window: the engine keeps no block there
                job = records.new_job(JobKind.LOAD, rid, seg_keys, spec, GPULoadStoreSpec(block_ids[lo:hi]),
                                   hit_tokens=(hi - lo) * block_size if g == 0 else 0)
                jobs.append(job)
                medium = str(spec.medium())
                self.cost.load_planned(medium, job.job_id, len(seg_keys),
                                       cancellable=not state.sync_answer and self.cost.cancellable(medium))
                if spec.medium() is not Medium.CPU:
                    promote_from = min(promote_from, offset)  # re-stored into the CPU tier from the device
                offset += len(seg_keys)
            loading += keys
        records.next_step.reqs_to_load[rid] = jobs
        if state.sync_answer:
            state.sync_answer = False
            records.next_step.sync_loads.add(rid)
            records.next_step.batch.add(request.num_tokens - full_tokens)
            state.sync_load = True
        state.loading = loading
        records.blocks_being_loaded.update(loading)
        state.next_stored = max(state.next_stored, promote_from)
        self.cost.observe_plan(time.perf_counter() - t0)
