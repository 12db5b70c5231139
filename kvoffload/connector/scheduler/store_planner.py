"""StorePlanner: each step, follow every request's device blocks and store its newly full
offloaded blocks into the first tier.

A store reads device blocks after the step that filled them; a sliding-window block the engine
released and handed out again before its store was planned holds another request's KV, so it
is not stored, and one a store in flight still reads is fenced: the worker finishes that store
before the step that writes the block.
"""

from __future__ import annotations

from kvoffload.connector.base import ScheduledStep
from kvoffload.connector.group_keys import NULL_BLOCK_ID
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.connector.scheduler.scheduler_records import Planner
from kvoffload.offload.mediums import GPULoadStoreSpec


def _storable(device_ids: list[int], factor: int) -> bool:
    """All engine blocks of an offloaded block are held (none released by a sliding window)."""
    return len(device_ids) == factor and NULL_BLOCK_ID not in device_ids


class StorePlanner(Planner):
    def follow_blocks(self, so: ScheduledStep) -> set[int]:
        """Follow each request's device blocks; returns the block ids the engine handed out
        this step (new blocks, and copy-on-write targets)."""
        records = self.records
        allocated: set[int] = set()
        #: Per request, the blocks it held before this step (the rest are fresh): only those
        #: can be stale. Requests not listed got no new blocks.
        sliding_ends: dict[str, list[int]] = {}
        for new in so.scheduled_new_reqs:
            ids = [list(g) for g in new.block_ids]
            records.state(new.req_id).block_ids = ids
            sliding_ends[new.req_id] = [0] * len(ids)  # all its blocks are its own, fresh
            for g in ids:
                allocated.update(g)
        cached = so.scheduled_cached_reqs
        resumed = cached.resumed_from_preemption
        for i, new_ids in enumerate(cached.new_block_ids):
            if not new_ids and not resumed[i]:
                continue  # a running request that got no block: nothing changed (most decode steps)
            rid = cached.req_ids[i]
            state = records.state(rid)
            if new_ids:
                self.reset_guard.filled(state, (b for g in new_ids for b in g))
            if resumed[i]:
                state.block_ids = [list(g) for g in new_ids] if new_ids else []
                sliding_ends[rid] = [0] * len(state.block_ids)
            elif new_ids:
                if not state.block_ids:
                    state.block_ids = [[] for _ in new_ids]
                sliding_ends[rid] = [len(g) for g in state.block_ids]
                for mine, g in zip(state.block_ids, new_ids):
                    mine.extend(g)
            for g in new_ids or ():
                allocated.update(g)
        for rid, replacements in so.block_replacements.items():
            replaced = records.requests.get(rid)
            for gid, idx, block_id in replacements:
                allocated.add(block_id)
                self.reset_guard.filled(replaced, (block_id,))
                if replaced is not None:
                    replaced.block_ids[gid][idx] = block_id  # copy-on-write gave this request a private block
        allocated.discard(NULL_BLOCK_ID)
        if self.groups.sliding_groups and allocated:
            self._forget_released_blocks(allocated, sliding_ends)
        return allocated

    def _forget_released_blocks(self, allocated: set[int], ends: dict[str, list[int]]) -> None:
        """A sliding-window group's block the engine released (out of the window) and handed
        out again this step holds another request's KV now: a store not planned yet must not
        read it (its position becomes the null block here; the copy is never made)."""
        f = self.records.factor
        for rid, state in self.records.requests.items():
            if state.stale_kv:
                continue  # stores nothing
            for g in self.groups.sliding_groups:
                if g >= len(state.block_ids):
                    continue
                ids = state.block_ids[g]
                end = ends[rid][g] if rid in ends else len(ids)
                for j in range(state.next_stored * f, min(end, len(ids))):
                    if ids[j] in allocated:
                        ids[j] = NULL_BLOCK_ID

    def plan(self, so: ScheduledStep) -> dict[str, list[TransferJob]]:
        """This step's store jobs, by request: the offloaded blocks filled up to the step's end."""
        records, groups = self.records, self.groups
        f = records.factor
        reqs_to_store: dict[str, list[TransferJob]] = {}
        for rid, n in so.num_scheduled_tokens.items():
            state = records.requests.get(rid)
            if state is None or state.request is None or state.stale_kv:
                continue  # stale: it read device KV from before a reset, nothing of it is stored
            request = state.request
            num_tokens = request.num_computed_tokens + n
            num_blocks = min(num_tokens // records.offloaded_block_size, len(request.block_hashes) // f)
            start = state.next_stored
            if num_blocks <= start:
                continue
            hashes = records.offload_hashes(request, start, num_blocks)
            jobs: list[TransferJob] = []
            complete = True
            for g in range(groups.num_groups):
                block_ids = state.block_ids[g]
                keys = groups.keys(hashes, g)
                # Blocks a sliding window released before their store was planned are not stored.
                index_of = {h: start + k for k, h in enumerate(keys)
                            if _storable(block_ids[(start + k) * f : (start + k + 1) * f], f)}
                if len(index_of) < len(keys):
                    keys = list(index_of)
                if not keys:
                    continue
                out = self.manager.prepare_store(keys)
                if out is None:
                    complete = False  # retried next step (what was prepared is stored now)
                    continue
                self.manager.touch(keys)
                self.stats.evicted_blocks += len(out.block_hashes_evicted)
                if not out.block_hashes_to_store:
                    continue
                records.events.describe(request, g, ((index_of[h], h) for h in out.block_hashes_to_store))
                device_ids: list[int] = []
                for h in out.block_hashes_to_store:
                    i = index_of[h]
                    device_ids.extend(block_ids[i * f : (i + 1) * f])
                job = records.new_job(JobKind.STORE, rid, out.block_hashes_to_store, GPULoadStoreSpec(device_ids),
                                   out.store_spec)
                if groups.windows[g] is not None:
                    records.fence(job.job_id, device_ids)
                jobs.append(job)
                state.storing.update(out.block_hashes_to_store)
            if complete:
                state.next_stored = num_blocks
            else:
                self.stats.store_retries += 1
            if jobs:
                reqs_to_store[rid] = jobs
        return reqs_to_store
