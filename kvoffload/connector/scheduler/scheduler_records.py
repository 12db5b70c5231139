"""SchedulerRecords: what the scheduler half's planners share about requests and copies.

Per request its one record (``RequestOffloadState``), dropped in one place; per job its record;
the blocks loads are filling (no second load or lookup may count on them); the sliding-window
blocks stores still read (fences); the next step's plan so far (``NextStep``, handed over whole
by ``build_connector_meta``); the offload keys of a request's blocks; and what KV events say of
the blocks planned.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import xxhash

from kvoffload.connector.base import EngineRequest, RequestSalt
from kvoffload.connector.cost.step_batch import StepBatch
from kvoffload.connector.group_keys import GroupGeometry
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.connector.scheduler.kv_event_translator import KVEventTranslator
from kvoffload.connector.scheduler.request_state import JobRecord, RequestOffloadState
from kvoffload.connector.scheduler.reset_guard import ResetGuard
from kvoffload.connector.scheduler.scheduler_stats import SchedulerSideStats
from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, as_list
from kvoffload.offload.chain import TierChain


@dataclass(slots=True)
class NextStep:
    """What the planners added to the next step's plan between two ``build_connector_meta``
    calls (loads are planned at allocation, swap-outs at preemption, waits at finish)."""

    reqs_to_load: dict[str, list[TransferJob]] = field(default_factory=dict)
    #: Of those, the ones loaded synchronously (inside the step's forward pass).
    sync_loads: set[str] = field(default_factory=set)
    swap_out: dict[str, list[TransferJob]] = field(default_factory=dict)
    #: Finished requests whose copies end before the step's report frees them.
    await_finish: set[str] = field(default_factory=set)
    #: The synchronous loads' new tokens, for whether one more joins the step.
    batch: StepBatch = field(default_factory=StepBatch)


class SchedulerRecords:
    def __init__(self, block_size: int, factor: int, request_salt: RequestSalt | None = None,
                 events: KVEventTranslator | None = None) -> None:
        self.block_size = block_size
        self.factor = factor
        self.offloaded_block_size = block_size * factor
        #: What else enters a request's offload keys beyond its tokens (an engine's adapter
        #: weights: vLLM hashes a LoRA by its name, and a retrained adapter keeps the name).
        self._request_salt = request_salt
        #: Salt of the offload keys since the last reset (None: never reset).
        self.key_salt: bytes | None = None
        self.requests: dict[str, RequestOffloadState] = {}
        self.jobs: dict[int, JobRecord] = {}
        self._job_ids = itertools.count()
        self.blocks_being_loaded: set[BlockHash] = set()
        #: Sliding-window groups' device blocks read by store jobs in flight: the engine may
        #: release such a block while its request runs, and must not write it before they land.
        self.fenced: dict[int, set[int]] = {}
        self.fence_of_job: dict[int, list[int]] = {}
        self.next_step = NextStep()
        #: The blocks' descriptions for KV events (a store or load plan describes its blocks).
        self.events = events or KVEventTranslator(False, block_size, factor)

    def state(self, rid: str) -> RequestOffloadState:
        state = self.requests.get(rid)
        if state is None:
            state = self.requests[rid] = RequestOffloadState()
        return state

    def drop(self, rid: str) -> None:
        """The one place a request's record goes: finished, and no copy reads or fills its blocks."""
        del self.requests[rid]

    def take_next_step(self) -> NextStep:
        """The next step's plan so far; planning starts afresh."""
        step, self.next_step = self.next_step, NextStep()
        return step

    def new_job(self, kind: JobKind, rid: str | None, hashes: list[BlockHash], src: LoadStoreSpec,
                dst: LoadStoreSpec, hit_tokens: int = 0) -> TransferJob:
        job = TransferJob(next(self._job_ids), kind, src, dst, rid)
        self.jobs[job.job_id] = JobRecord(job, list(hashes), hit_tokens)
        if kind is JobKind.LOAD and rid is not None:
            self.state(rid).loads_in_flight += 1
        return job

    def offload_hashes(self, request: EngineRequest, start: int, end: int) -> list[BlockHash]:
        """Offload keys of offloaded blocks [start, end): the engine's hash of each one's last
        engine block, salted with the request's salt (its adapter) and with the reset epoch
        once the cache was reset."""
        f = self.factor
        hashes = as_list(request.block_hashes[f * start + f - 1 : f * end : f])
        salt = self.key_salt
        extra = self._request_salt(request) if self._request_salt is not None else None
        if extra is not None:
            salt = extra if salt is None else salt + extra
        if salt is None:
            return hashes
        return [xxhash.xxh3_128(salt + (h if isinstance(h, bytes) else repr(h).encode())).digest() for h in hashes]

    def keys_in_flight(self) -> set[BlockHash]:
        return {h for record in self.jobs.values() for h in record.block_hashes}

    def fence(self, job_id: int, block_ids: list[int]) -> None:
        self.fence_of_job[job_id] = block_ids
        for b in block_ids:
            self.fenced.setdefault(b, set()).add(job_id)

    def unfence(self, job_id: int) -> None:
        for b in self.fence_of_job.pop(job_id, ()):
            jobs = self.fenced.get(b)
            if jobs is not None:
                jobs.discard(job_id)
                if not jobs:
                    del self.fenced[b]


class Planner:
    """What every planner works over: the records, the tier chain, the KV groups' geometry, the
    counters and the reset guard (one of each per scheduler half, shared)."""

    def __init__(self, records: SchedulerRecords, manager: TierChain, groups: GroupGeometry,
                 stats: SchedulerSideStats, reset_guard: ResetGuard) -> None:
        self.records = records
        self.manager = manager
        self.groups = groups
        self.stats = stats
        self.reset_guard = reset_guard
