"""Scheduler half of the OffloadingConnector: plans loads and stores; never touches a tensor.

Offloaded blocks may span ``block_size_factor`` engine blocks; offloaded block i is keyed by
the chained hash of its last engine block (which covers the whole prefix up to it).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

import xxhash

from kvoffload.connector.base import AllocatedBlocks, EngineRequest, GroupBlockIds, RequestSalt, StepPlan
from kvoffload.connector.group_keys import NULL_BLOCK_ID, GroupGeometry, group_key
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.connector.offloading_metadata import OffloadingConnectorMetadata
from kvoffload.connector.request_state import JobRecord, RequestOffloadState, SwapRecord
from kvoffload.connector.reset_guard import ResetGuard
from kvoffload.offload.abstract import (
    BlockHash,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    PrepareStoreOutput,
    as_list,
)
from kvoffload.offload.chain import TierChain
from kvoffload.offload.chain_of_one import as_chain
from kvoffload.offload.mediums import GPULoadStoreSpec
from kvoffload.offload.spec import OffloadingSpec
from kvoffload.transfer.handler import TransferResult

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SchedulerSideStats:
    lookups: int = 0
    lookups_deferred: int = 0
    blocks_loaded: int = 0
    blocks_stored: int = 0
    stores_failed: int = 0
    loads_failed: int = 0
    store_retries: int = 0
    evicted_blocks: int = 0
    blocks_demoted: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    resets: int = 0
    #: Store jobs the worker had to finish before a step: they read sliding-window blocks the
    #: engine had released and handed out again.
    store_flushes: int = 0
    #: Prompt tokens (and blocks) served by each tier: counted when the load lands, not when
    #: it is planned; a planned hit whose load failed counts in tier_failed_hits instead.
    tier_hits: Counter[str] = field(default_factory=Counter)
    tier_hit_blocks: Counter[str] = field(default_factory=Counter)
    tier_failed_hits: Counter[str] = field(default_factory=Counter)
    #: (tier, reason) -> blocks a read rejected (checksum, auth, key, format, missing).
    tier_rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: tier -> blocks its worker did not store because its writes were too slow (backpressure).
    tier_stores_skipped: Counter[str] = field(default_factory=Counter)


def _merge(parts: list[TransferResult]) -> TransferResult:
    """One result for a job every rank ran: success only if all succeeded."""
    first = parts[0]
    bad = tuple(sorted({b for p in parts for b in p.bad_block_ids}))
    rejected: dict[str, int] = {}
    for p in parts:  # ranks reject their shards of the same blocks: count each block once
        for reason, n in p.rejected:
            rejected[reason] = max(rejected.get(reason, 0), n)
    return replace(first, success=all(p.success for p in parts), nbytes=sum(p.nbytes for p in parts),
                   seconds=max(p.seconds for p in parts), bad_block_ids=bad, io_error=any(p.io_error for p in parts),
                   rejected=tuple(sorted(rejected.items())), skipped=any(p.skipped for p in parts))


class ConnectorStatsDict(TypedDict):
    """The scheduler half's counters, as ``stats()`` reports them (by tier where a dict)."""

    lookups: int
    hit_tokens_by_tier: dict[str, int]
    hit_blocks_by_tier: dict[str, int]
    failed_hit_tokens_by_tier: dict[str, int]
    tier_rejected_blocks: dict[str, dict[str, int]]
    tier_stores_skipped: dict[str, int]
    tier_usage: dict[str, list[int]]
    jobs_in_flight: int
    demotions_queued: int
    blocks_loaded: int
    blocks_stored: int
    blocks_evicted: int
    stores_skipped_by_filter: int
    store_retries: int
    stores_failed: int
    loads_failed: int
    lookups_deferred: int
    blocks_demoted: int
    corrupt_blocks: int
    disk_blocks_recovered: int
    disk_io_errors: int
    disk_outages: int
    tier_io_errors: dict[str, int]
    tier_outages: dict[str, int]
    blocks_swapped_out: int
    blocks_swapped_in: int
    store_flushes: int


def _by_tier(counts: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (tier, reason), n in counts.items():
        out.setdefault(tier, {})[reason] = n
    return out


def _storable(device_ids: list[int], factor: int) -> bool:
    """All engine blocks of an offloaded block are held (none released by a sliding window)."""
    return len(device_ids) == factor and NULL_BLOCK_ID not in device_ids


class OffloadingConnectorScheduler:
    def __init__(self, spec: OffloadingSpec, request_salt: RequestSalt | None = None) -> None:
        self.spec = spec
        #: What else enters a request's offload keys beyond its tokens (an engine's adapter
        #: weights: vLLM hashes a LoRA by its name, and a retrained adapter keeps the name).
        self._request_salt = request_salt
        self.manager: TierChain = as_chain(spec.get_manager())
        self.block_size = spec.kv_info.block_size
        self.offloaded_block_size = spec.offloaded_block_size
        self.factor = spec.block_size_factor
        self.world_size = spec.kv_info.world_size
        self.groups = GroupGeometry(spec.kv_info.group_windows, self.block_size, self.factor)
        #: Tokens the engine found on the device at the last lookup (where its loads start).
        self._local_tokens: dict[str, int] = {}
        #: Sliding-window groups' device blocks read by store jobs in flight: the engine may
        #: release such a block while its request runs, and must not write it before they land.
        self._fenced: dict[int, set[int]] = {}
        self._fence_of_job: dict[int, list[int]] = {}
        #: Results of jobs some ranks have reported and others not yet.
        self._partial: dict[int, list[TransferResult]] = {}
        self._requests: dict[str, RequestOffloadState] = {}
        self._jobs: dict[int, JobRecord] = {}
        self._blocks_being_loaded: set[BlockHash] = set()
        #: This step's plan, sent (and reset) by build_connector_meta.
        self._reqs_to_load: dict[str, list[TransferJob]] = {}
        self._swap_out: dict[str, list[TransferJob]] = {}
        self._delayed: set[str] = set()
        self._job_ids = itertools.count()
        self.stats = SchedulerSideStats()
        #: Salt of the offload keys since the last reset_cache (None: never reset).
        self._key_salt: bytes | None = None
        #: After a reset: which requests read device KV older than it (they store nothing).
        self._reset_guard = ResetGuard()

    def _state(self, rid: str) -> RequestOffloadState:
        state = self._requests.get(rid)
        if state is None:
            state = self._requests[rid] = RequestOffloadState()
        return state

    def _new_job(self, kind: JobKind, rid: str | None, hashes: list[BlockHash], src: LoadStoreSpec,
                 dst: LoadStoreSpec, hit_tokens: int = 0) -> TransferJob:
        job = TransferJob(next(self._job_ids), kind, src, dst, rid)
        self._jobs[job.job_id] = JobRecord(job, list(hashes), hit_tokens)
        if kind is JobKind.LOAD and rid is not None:
            self._state(rid).loads_in_flight += 1
        return job

    def _offload_hashes(self, request: EngineRequest, start: int, end: int) -> list[BlockHash]:
        """Offload keys of offloaded blocks [start, end): the engine's hash of each one's last
        engine block, salted with the request's salt (its adapter) and with the reset epoch
        once the cache was reset."""
        f = self.factor
        hashes = as_list(request.block_hashes[f * start + f - 1 : f * end : f])
        salt = self._key_salt
        extra = self._request_salt(request) if self._request_salt is not None else None
        if extra is not None:
            salt = extra if salt is None else salt + extra
        if salt is None:
            return hashes
        return [xxhash.xxh3_128(salt + (h if isinstance(h, bytes) else repr(h).encode())).digest() for h in hashes]

    def reset_cache(self) -> bool:
        """Forget every offloaded block, in every tier, for this engine (the model's weights
        changed in place). Offload keys get a fresh random salt: nothing stored before is ever
        found again, a restarted engine never finds what is stored after (its keys are unsalted),
        and a shared tier's other replicas keep their blocks. Requests already tracked store
        nothing more (their KV was computed before the reset); copies in flight finish under the
        old keys, which nobody looks up again. Old blocks leave the tiers by eviction. The
        engine's own device reset may fail (requests hold blocks) without the connector being
        told: ``ResetGuard`` keeps blocks computed from device KV older than the reset out of
        the tiers either way."""
        self._key_salt = os.urandom(16)
        for state in self._requests.values():
            state.next_stored = 1 << 62
            state.swapped = None
        self._reset_guard.reset(self._requests)
        self.stats.resets += 1
        logger.info("kvoffload: offload cache reset (reset %d): blocks stored before it are never served again",
                    self.stats.resets)
        return True

    # ---- lookups and loads -----------------------------------------------------------------
    def _swap_first(self, group: int, computed: int) -> int:
        """The first engine block ``group`` needs to resume after ``computed`` tokens (a sliding
        window's: the block of the first position the next token attends to)."""
        window = self.groups.windows[group]
        return 0 if window is None else max(0, computed - window + 1) // self.block_size

    def _swap_keys(self, request: EngineRequest, computed: int, tail: BlockHash | None,
                   first: int = 0) -> list[tuple[int, int, list[BlockHash]]]:
        """Per group: (its first block, the index of the tail block, the keys of its blocks from
        there on and of its tail) for a request swapped out at ``computed`` tokens."""
        full = computed // self.block_size
        hashes = self._offload_hashes(request, 0, full)
        out = []
        for g in range(self.groups.num_groups):
            start = max(first, self._swap_first(g, computed))
            keys = self.groups.keys(hashes[start:], g)
            out.append((start, full, keys + ([group_key(tail, g)] if tail is not None else [])))
        return out

    def _swap_hit(self, request: EngineRequest, num_computed_tokens: int) -> int:
        """Tokens a swapped-out request can restore exactly (every group's blocks it needs + the tail)."""
        swapped = self._requests[request.request_id].swapped
        assert swapped is not None
        for _, _, keys in self._swap_keys(request, swapped.computed_tokens, swapped.tail_key):
            if self.manager.lookup(keys) != len(keys) or not self._blocks_being_loaded.isdisjoint(keys):
                return 0
        return max(0, swapped.computed_tokens - num_computed_tokens)

    def get_num_new_matched_tokens(self, request: EngineRequest, num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self._requests.get(request.request_id)
        if state is not None and state.swapped is not None:
            restorable = self._swap_hit(request, num_computed_tokens)
            if restorable:
                return restorable, True
            state.swapped = None  # evicted meanwhile: the plain path decides
        num_blocks = request.num_tokens // self.offloaded_block_size
        hashes = self._offload_hashes(request, 0, num_blocks)
        groups = self.groups
        self._local_tokens[request.request_id] = num_computed_tokens
        for g in groups.full_groups:
            self.manager.touch(groups.keys(hashes, g))
        for g in groups.sliding_groups:  # only the window a hit at the prompt's end needs
            self.manager.touch(groups.keys(hashes[groups.first_needed(g, num_blocks):], g))
        start = num_computed_tokens // self.offloaded_block_size
        if start >= len(hashes):
            return 0, False
        self.stats.lookups += 1
        end = len(hashes)
        for g in groups.full_groups:
            found = self.manager.lookup_prefix(groups.keys(hashes[start:end], g))
            if found.stop is LookupResult.RETRY:
                return None, False
            if found.stop is LookupResult.HIT_PENDING:
                # The next block's store is still in flight: wait a step for it rather than
                # recompute it (hit counts then do not depend on copy timing).
                self.stats.lookups_deferred += 1
                return None, False
            end = start + found.hits
        if groups.sliding_groups:
            sliding_end = self._sliding_hit_end(hashes, start, end)
            if sliding_end is None:
                return None, False
            end = sliding_end
        if end <= start:
            return 0, False
        num_hit_tokens = end * self.offloaded_block_size - num_computed_tokens
        if num_hit_tokens <= 0:
            return 0, False
        loads = self._group_loads(hashes[start:end], start, end)
        if not all(self._blocks_being_loaded.isdisjoint(keys) for _, keys in loads):
            self.stats.lookups_deferred += 1
            return None, False  # another request is loading these blocks: ask again later
        return num_hit_tokens, True

    def _sliding_hit_end(self, hashes: list[BlockHash], start: int, end: int) -> int | None:
        """The longest hit end <= ``end`` whose window every sliding group holds (all or
        nothing: a group missing a block shortens the hit for every group). None: ask again."""
        groups = self.groups
        while end > start:
            for g in groups.sliding_groups:
                first = max(start, groups.first_needed(g, end))
                found = self.manager.lookup(groups.keys(hashes[first:end], g))
                if found is None:
                    return None
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

    def update_state_after_alloc(self, request: EngineRequest, blocks: AllocatedBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        state = self._state(rid)
        state.request = request
        state.block_ids = [list(ids) for ids in blocks.get_block_ids()]
        local = self._local_tokens.pop(rid, None)
        # Local prefix hits: what the lookup was told, else (an engine that skipped the lookup:
        # one full-attention group) the blocks that already carry a hash.
        num_local = local if local is not None else sum(
            1 for b in blocks.blocks[0] if b.block_hash is not None) * self.block_size
        if self._reset_guard.admit(rid, state.block_ids, num_local // self.block_size):
            state.next_stored = 1 << 62  # it reads device KV from before a reset: nothing of it is stored
        if num_external_tokens == 0:
            return
        if state.swapped is not None:
            self._plan_swap_in(request, state, num_local, num_external_tokens)
            return
        full_tokens = num_local + num_external_tokens
        if full_tokens % self.offloaded_block_size or num_external_tokens % self.block_size:
            raise AssertionError(
                f"request {rid}: {num_local} local + {num_external_tokens} external tokens do not end on "
                f"an offloaded block boundary ({self.offloaded_block_size})"
            )
        start = num_local // self.offloaded_block_size
        end = full_tokens // self.offloaded_block_size
        hashes = self._offload_hashes(request, start, end)
        jobs = []
        first_engine = num_local // self.block_size
        promote_from = end
        f = self.factor
        loading: list[BlockHash] = []
        for g, (offset, keys) in enumerate(self._group_loads(hashes, start, end)):
            block_ids = state.block_ids[g]
            for spec, seg_keys in self.manager.prepare_load_segments(keys):
                lo = max(offset * f, first_engine)
                hi = (offset + len(seg_keys)) * f
                while lo < hi and block_ids[lo] == NULL_BLOCK_ID:
                    lo += 1  # left of a sliding window: the engine keeps no block there
                jobs.append(self._new_job(JobKind.LOAD, rid, seg_keys, spec, GPULoadStoreSpec(block_ids[lo:hi]),
                                          hit_tokens=(hi - lo) * self.block_size if g == 0 else 0))
                if spec.medium() is not Medium.CPU:
                    promote_from = min(promote_from, offset)  # re-stored into the CPU tier from the device
                offset += len(seg_keys)
            loading += keys
        self._reqs_to_load[rid] = jobs
        state.loading = loading
        self._blocks_being_loaded.update(loading)
        state.next_stored = max(state.next_stored, promote_from)

    # ---- swap-mode preemption ------------------------------------------------------------
    def swap_out(self, request: EngineRequest, block_ids: GroupBlockIds) -> bool:
        if self.factor != 1:
            return False  # a partial tail does not fit a multi-block offloaded slot
        rid = request.request_id
        if self._reset_guard.tainted(rid):
            return False  # its KV is older than a reset: recompute it
        computed = request.num_computed_tokens
        if computed == 0:
            return False
        # The partial block has no chained hash; key it by request and length (16 bytes, so a
        # disk tier could hold it too).
        tail = xxhash.xxh3_128(f"swap|{rid}|{computed}".encode()).digest() if computed % self.block_size else None
        state = self._state(rid)
        jobs = []
        for g, (start, full, keys) in enumerate(self._swap_keys(request, computed, tail)):
            ids = list(block_ids[g])[start : full + (tail is not None)]
            if NULL_BLOCK_ID in ids:
                break  # a block it needs was released (cannot happen for a running request): recompute
            out = self.manager.prepare_store(keys)
            if out is None:
                break  # the tier is full of pinned blocks: store what we have, recompute
            if out.block_hashes_to_store:
                index_of = {h: i for i, h in enumerate(keys)}
                jobs.append(self._store_job(state, rid, out, [ids[index_of[h]] for h in out.block_hashes_to_store]))
        else:
            self._swap_out[rid] = jobs
            state.swapped = SwapRecord(computed, tail)
            state.next_stored = max(state.next_stored, computed // self.block_size)
            self.stats.blocks_swapped_out += sum(len(j.src) for j in jobs)
            return True
        if jobs:
            self._swap_out[rid] = jobs
        return False

    def _store_job(self, state: RequestOffloadState, rid: str, out: PrepareStoreOutput,
                   device_ids: list[int]) -> TransferJob:
        state.storing.update(out.block_hashes_to_store)
        return self._new_job(JobKind.SWAP_OUT, rid, out.block_hashes_to_store, GPULoadStoreSpec(device_ids),
                             out.store_spec)

    def _plan_swap_in(self, request: EngineRequest, state: RequestOffloadState, num_local: int,
                      num_external: int) -> None:
        rid = request.request_id
        assert state.swapped is not None
        computed, tail = state.swapped.computed_tokens, state.swapped.tail_key
        state.swapped = None
        assert num_local + num_external == computed, "swap-in must restore exactly what was swapped out"
        jobs = []
        loading: list[BlockHash] = []
        for g, (start, full, keys) in enumerate(self._swap_keys(request, computed, tail, num_local // self.block_size)):
            device_ids = state.block_ids[g][start : full + (tail is not None)]
            # Swapped blocks may have been demoted meanwhile: load each tier's run on its own.
            offset = 0
            for spec, seg in self.manager.prepare_load_segments(keys):
                jobs.append(self._new_job(JobKind.LOAD, rid, seg, spec,
                                          GPULoadStoreSpec(device_ids[offset : offset + len(seg)])))
                offset += len(seg)
            loading += keys
        self._reqs_to_load[rid] = jobs
        state.loading = loading
        self._blocks_being_loaded.update(loading)
        self.stats.blocks_swapped_in += len(loading)

    # ---- stores ------------------------------------------------------------------------------
    def _update_block_ids(self, so: StepPlan) -> set[int]:
        """Follow each request's device blocks; returns the block ids the engine handed out
        this step (new blocks, and copy-on-write targets)."""
        allocated: set[int] = set()
        #: Per request, the blocks it held before this step (the rest are fresh): only those
        #: can be stale. Requests not listed got no new blocks.
        sliding_ends: dict[str, list[int]] = {}
        for new in so.scheduled_new_reqs:
            ids = [list(g) for g in new.block_ids]
            self._state(new.req_id).block_ids = ids
            sliding_ends[new.req_id] = [0] * len(ids)  # all its blocks are its own, fresh
            for g in ids:
                allocated.update(g)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            state = self._state(rid)
            if new_ids:
                self._reset_guard.filled(rid, (b for g in new_ids for b in g))
            if cached.resumed_from_preemption[i]:
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
            replaced = self._requests.get(rid)
            for gid, idx, block_id in replacements:
                allocated.add(block_id)
                self._reset_guard.filled(rid, (block_id,))
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
        f = self.factor
        for rid, state in self._requests.items():
            for g in self.groups.sliding_groups:
                if g >= len(state.block_ids):
                    continue
                ids = state.block_ids[g]
                end = ends[rid][g] if rid in ends else len(ids)
                for j in range(state.next_stored * f, min(end, len(ids))):
                    if ids[j] in allocated:
                        ids[j] = NULL_BLOCK_ID

    def _plan_stores(self, so: StepPlan) -> dict[str, list[TransferJob]]:
        reqs_to_store: dict[str, list[TransferJob]] = {}
        f = self.factor
        groups = self.groups
        for rid, n in so.num_scheduled_tokens.items():
            state = self._requests.get(rid)
            if state is None or state.request is None:
                continue
            request = state.request
            num_tokens = request.num_computed_tokens + n
            num_blocks = min(num_tokens // self.offloaded_block_size, len(request.block_hashes) // f)
            start = state.next_stored
            if num_blocks <= start:
                continue
            hashes = self._offload_hashes(request, start, num_blocks)
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
                device_ids: list[int] = []
                for h in out.block_hashes_to_store:
                    i = index_of[h]
                    device_ids.extend(block_ids[i * f : (i + 1) * f])
                job = self._new_job(JobKind.STORE, rid, out.block_hashes_to_store, GPULoadStoreSpec(device_ids),
                                    out.store_spec)
                if groups.windows[g] is not None:
                    self._fence(job.job_id, device_ids)
                jobs.append(job)
                state.storing.update(out.block_hashes_to_store)
            if complete:
                state.next_stored = num_blocks
            else:
                self.stats.store_retries += 1
            if jobs:
                reqs_to_store[rid] = jobs
        return reqs_to_store

    def _fence(self, job_id: int, block_ids: list[int]) -> None:
        self._fence_of_job[job_id] = block_ids
        for b in block_ids:
            self._fenced.setdefault(b, set()).add(job_id)

    def _unfence(self, job_id: int) -> None:
        for b in self._fence_of_job.pop(job_id, ()):
            jobs = self._fenced.get(b)
            if jobs is not None:
                jobs.discard(job_id)
                if not jobs:
                    del self._fenced[b]

    def has_pending_work(self) -> bool:
        """Jobs in flight, or demotions the manager queued that no step has planned yet."""
        return bool(self._jobs) or self.manager.has_pending_demotions()

    def _plan_demotions(self) -> list[TransferJob]:
        return [self._new_job(JobKind.DEMOTE, None, d.block_hashes, d.src, d.dst) for d in self.manager.take_demotions()]

    def build_connector_meta(self, scheduler_output: StepPlan) -> OffloadingConnectorMetadata:
        allocated = self._update_block_ids(scheduler_output)
        # Stores still reading a block the engine handed out again must land before it is written.
        flush = {j for b in allocated if b in self._fenced for j in self._fenced[b]} if self._fenced else set()
        self.stats.store_flushes += len(flush)
        reqs_to_store = self._plan_stores(scheduler_output)
        meta = OffloadingConnectorMetadata(
            flush_jobs=flush,
            reqs_to_load=self._reqs_to_load,
            reqs_to_store=reqs_to_store,
            preempted_req_ids=set(scheduler_output.preempted_req_ids),
            demotions=self._plan_demotions(),
            swap_out=self._swap_out,
            await_finish=self._delayed,
        )
        self._reqs_to_load = {}
        self._swap_out = {}
        self._delayed = set()
        return meta

    # ---- completions -------------------------------------------------------------------------
    def update_connector_output(self, results: Sequence[TransferResult]) -> None:
        """Digest the worker halves' results (every rank's, in any order)."""
        for result in results:
            job_id = result.job_id
            if job_id not in self._jobs:
                continue
            if self.world_size > 1:
                # Every rank reports each job; it is done when the last rank is, and failed if any failed.
                parts = self._partial.setdefault(job_id, [])
                parts.append(result)
                if len(parts) < self.world_size:
                    continue
                del self._partial[job_id]
                result = _merge(parts)
            self._complete(self._jobs.pop(job_id), result)

    def _complete(self, job: JobRecord, result: TransferResult) -> None:
        kind, hashes = job.kind, job.block_hashes
        if self._fence_of_job:
            self._unfence(job.job.job_id)
        state = self._requests.get(job.req_id) if job.req_id is not None else None
        if kind is JobKind.DEMOTE:
            self.manager.complete_demotion(hashes, result.success, job.medium)
            self._record_io(job.medium, result, write=True)
            self.stats.blocks_demoted += len(hashes) if result.success else 0
            if result.skipped:
                self.stats.tier_stores_skipped[job.medium.lower()] += len(hashes)
        elif kind is JobKind.LOAD:
            self.manager.complete_load(hashes, job.medium)
            self._blocks_being_loaded.difference_update(hashes)
            if state is not None:
                state.loads_in_flight -= 1
                if not state.loads_in_flight:
                    state.loading = None
            if result.bad_block_ids:
                # Corrupt, misplaced or unreadable: drop, so the next lookup misses and recomputes.
                self.manager.drop_corrupt(job.medium, list(result.bad_block_ids))
            self._record_io(job.medium, result)
            tier = job.medium.lower()  # "cpu" / "disk", as stats() reports
            for reason, n in result.rejected:
                self.stats.tier_rejected[(tier, reason)] += n
            if result.success:
                self.stats.blocks_loaded += len(hashes)
                if job.hit_tokens:
                    self.stats.tier_hits[tier] += job.hit_tokens
                    self.stats.tier_hit_blocks[tier] += len(hashes)
            else:
                self.stats.loads_failed += len(hashes)
                if job.hit_tokens:
                    self.stats.tier_failed_hits[tier] += job.hit_tokens
        else:  # STORE, SWAP_OUT
            self.manager.complete_store(hashes, result.success)
            if state is not None:
                state.storing.subtract(hashes)
                state.storing = +state.storing
            if result.success:
                self.stats.blocks_stored += len(hashes)
            else:
                self.stats.stores_failed += len(hashes)
        if state is not None and state.finished and not state.busy:
            del self._requests[job.req_id]  # type: ignore[arg-type]

    def _record_io(self, medium: str, result: TransferResult, write: bool = False) -> None:
        if result.success or result.io_error:
            self.manager.record_io(medium, result.success, write)

    def request_finished(self, request: EngineRequest, block_ids: GroupBlockIds) -> tuple[bool, dict[str, object] | None]:
        """The engine finished ``request`` (done, aborted or failed, in any phase).

        Exactly one later report frees its blocks, whatever happened in between: a request with
        a load planned or in flight is reported by the worker as finished-*receiving* once the
        load is done (the engine waits for that report on its own, and may already have it in
        the step output it is processing); any other request with copies in flight is reported
        as finished-*sending* (``await_finish``). Reporting both would free it twice.
        """
        rid = request.request_id
        self._local_tokens.pop(rid, None)
        self._reset_guard.forget(rid)
        state = self._requests.get(rid)
        if state is None:
            return False, None
        # Planned loads are sent anyway: the worker's finished-receiving report is what frees
        # the request's blocks in the engine, so the load must reach the worker.
        delay = state.busy
        if delay:
            if state.loading is None:
                self._delayed.add(rid)
            state.request, state.block_ids, state.swapped, state.finished = None, [], None, True
        else:
            del self._requests[rid]
        return delay, None

    def take_events(self) -> list[OffloadingEvent]:
        return list(self.manager.take_events())

    def stats_dict(self) -> ConnectorStatsDict:
        s = self.stats
        report = self.manager.report()
        secondaries = report.tiers[1:]
        disk = report.tier("disk")
        return {
            "lookups": s.lookups,
            "hit_tokens_by_tier": dict(s.tier_hits),
            "hit_blocks_by_tier": dict(s.tier_hit_blocks),
            "failed_hit_tokens_by_tier": dict(s.tier_failed_hits),
            "tier_rejected_blocks": _by_tier(s.tier_rejected),
            "tier_stores_skipped": dict(s.tier_stores_skipped),
            "tier_usage": {t.name: [t.blocks_used, t.capacity_blocks] for t in report.tiers},
            "jobs_in_flight": len(self._jobs),
            "demotions_queued": int(self.manager.has_pending_demotions()),
            "blocks_loaded": s.blocks_loaded,
            "blocks_stored": s.blocks_stored,
            "blocks_evicted": s.evicted_blocks,
            "stores_skipped_by_filter": report.stores_skipped_by_filter,
            "store_retries": s.store_retries,
            "stores_failed": s.stores_failed,
            "loads_failed": s.loads_failed,
            "lookups_deferred": s.lookups_deferred,
            "blocks_demoted": s.blocks_demoted,
            # Records dropped as corrupt (a read's, or torn ones found when a tier opened).
            "corrupt_blocks": report.corrupt_blocks,
            "disk_blocks_recovered": disk.blocks_recovered if disk else 0,
            "disk_io_errors": disk.io_errors if disk else 0,
            "disk_outages": disk.outages if disk else 0,
            # Every secondary tier's health, by tier: {"disk": 0, "mooncake": 2}.
            "tier_io_errors": {t.name: t.io_errors for t in secondaries},
            "tier_outages": {t.name: t.outages for t in secondaries},
            "blocks_swapped_out": s.blocks_swapped_out,
            "blocks_swapped_in": s.blocks_swapped_in,
            "store_flushes": s.store_flushes,
        }
