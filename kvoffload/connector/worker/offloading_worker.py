"""Worker half of the OffloadingConnector: runs the planned copies; decides nothing.

Loads are submitted as soon as their plan arrives; stores planned in step N are submitted at
the start of step N+1 (the KV they read is only written by step N's forward pass, and
submitting later keeps the copy off the path to sampling). A request is reported as
finished-sending once the scheduler half said it kept its blocks (``await_finish``) and none
of its copies is outstanding. A request with asynchronous loads is reported as
finished-receiving (or failed) once all of them are done, whether or not the engine has
finished it meanwhile: the engine frees a finished request on that report, and the scheduler
half never asks for a finished-sending report of a request that was loading. Each request is
reported once.

Synchronous (layer-wise) loads belong to requests the engine scheduled in the same step
(``StepSyncLoads``). They are never reported as received; a failed one reports its device
blocks (``take_failed_block_ids``) in the same step, and the stores that step planned are
dropped (reported failed): they may hold KV computed from the bad blocks.

Layer-wise stores (every ``load_mode`` but ``async`` on the first tier): the stores a step
plans start in that step, each layer copied out once ``save_kv_layer`` says the forward pass
wrote it; ``wait_for_save`` submits the layers no hook named and commits them, or aborts them
if a synchronous load of the step failed. A store the handler cannot take layer by layer (a
tier other than host memory first) still starts after the step.
"""

from __future__ import annotations

import time

from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.connector.offloading_metadata import LoadReading, OffloadingConnectorMetadata, StepTiming
from kvoffload.connector.worker.load_blocks import LoadBlocks
from kvoffload.connector.worker.request_record import WorkerRequestState, take_deferred
from kvoffload.connector.worker.spec_router import spec_router
from kvoffload.connector.worker.step_clock import StepClock
from kvoffload.connector.worker.sync_loads import StepSyncLoads
from kvoffload.connector.worker.transfer_stats import DirectionStatsDict, TransferStats
from kvoffload.offload.spec import OffloadingSpec
from kvoffload.transfer.handler import OffloadingHandler, TransferRouter
from kvoffload.transfer.layout import CanonicalKVCache, KVCaches, canonicalize
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE, TransferResult


class OffloadingConnectorWorker:
    def __init__(self, spec: OffloadingSpec) -> None:
        self.spec = spec
        self.worker: TransferRouter | None = None
        self.kv: CanonicalKVCache | None = None
        self._jobs: dict[int, TransferJob] = {}
        #: One record per request with copies in flight or planned, or a report owed. A request
        #: one of whose loads failed is reported once all its loads are done (a failed request's
        #: blocks are freed for recompute: no copy may still write into them).
        self._requests: dict[str, WorkerRequestState] = {}
        #: Device blocks of loads, and those whose load failed (take_failed_block_ids).
        self.load_blocks = LoadBlocks()
        #: This step's synchronous loads (read inside its forward pass).
        self._sync = StepSyncLoads()
        self._results: list[TransferResult | StepTiming] = []
        #: Times each forward pass (begin_step to wait_for_save; on CUDA as the device ran it).
        self._clock = StepClock()
        #: This step's requests with loads issued and the host time issuing them (cost model).
        self._load_requests, self._load_host_s = 0, 0.0
        #: The plan whose demotions were submitted (held, so its identity stays unique).
        self._demoted_meta: OffloadingConnectorMetadata | None = None
        #: Stores start layer by layer in the step that plans them (not for load_mode async).
        self.layered_stores = next(iter(spec.config.tier_load_modes().values()), "async") != "async"
        #: The step's plan (begin_step; its stores wait in their requests' records) and whether
        #: its layer-wise stores are open (the first save_kv_layer opens them).
        self._step_meta: OffloadingConnectorMetadata | None = None
        self._layered_open = False
        self.stats = TransferStats()

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        canonical = canonicalize(kv_caches, self.spec.kv_info.num_device_blocks)
        self.kv = canonical
        self._clock.bind(canonical.device)
        self.worker = spec_router(self.spec, canonical)

    @property
    def handlers(self) -> list[OffloadingHandler]:
        """Each handler of the registered caches once (the router's list)."""
        return self.worker.handlers if self.worker is not None else []

    def _state(self, rid: str) -> WorkerRequestState:
        st = self._requests.get(rid)
        if st is None:
            st = self._requests[rid] = WorkerRequestState()
        return st

    def _prune(self, rid: str) -> None:
        st = self._requests.get(rid)
        if st is not None and st.idle:
            del self._requests[rid]

    def _submit(self, job: TransferJob, sync: bool = False) -> None:
        """Submit one copy (a demotion belongs to no request); ``sync``: a load the engine reads
        in this very step."""
        assert self.worker is not None, "register_kv_caches must run before any transfer"
        rid, is_load = job.req_id, job.kind is JobKind.LOAD
        if self.worker.transfer_async(job.job_id, (job.src, job.dst)):
            self._jobs[job.job_id] = job
            if sync:
                self._sync.add(job.job_id, self.worker.layer_progress(job.job_id), len(job.dst.block_ids))
                self.load_blocks.track(job.job_id, job.dst.block_ids.tolist(), sync=True)
                if rid is not None:
                    self._state(rid).outstanding += 1
                return
            if rid is not None:
                st = self._state(rid)
                st.outstanding += 1
                if is_load:
                    st.loads_pending += 1
                    self.load_blocks.track(job.job_id, job.dst.block_ids.tolist(), sync=False)
            return
        direction = HOST_TO_DEVICE if is_load else DEVICE_TO_HOST
        self._results.append(TransferResult(job.job_id, False, 0, 0.0, direction))
        if sync:
            self.load_blocks.refused(job.dst.block_ids.tolist(), sync=True)
            self._sync.failed = True
            return
        if rid is not None and is_load:
            self.load_blocks.refused(job.dst.block_ids.tolist(), sync=False)
            st = self._state(rid)
            st.load_failed = True
            if not st.loads_pending:
                self._report_failed(rid)

    def _submit_deferred(self) -> None:
        if not self._requests:
            return  # no request has a copy planned or owed (most decode steps)
        for job in take_deferred(self._requests.values()):
            self._submit(job)
        for rid in [rid for rid, st in self._requests.items() if st.idle]:
            del self._requests[rid]

    def _submit_demotions(self, meta: OffloadingConnectorMetadata) -> None:
        """Demotions go first, whichever hook runs first: they fence the CPU slots they read,
        and a store planned in the same step (swap-out, promotion) may take those slots over."""
        if self._demoted_meta is meta:
            return
        self._demoted_meta = meta
        for job in meta.demotions:
            self._submit(job)

    def handle_preemptions(self, meta: OffloadingConnectorMetadata) -> None:
        """Before the forward pass, every step (vLLM starts a step without synchronous loads
        only after its forward): preemption is a barrier (copies reading a preempted request's
        blocks finish first), and so is a block handed out again (stores still reading it
        finish before the forward writes it)."""
        if meta is None or not (meta.preempted_req_ids or meta.swap_out or meta.flush_jobs):
            return
        self._submit_demotions(meta)
        self._submit_deferred()
        for jobs in meta.swap_out.values():
            for job in jobs:
                self._submit(job)
        assert self.worker is not None
        barrier = [j for j, job in self._jobs.items() if job.req_id in meta.preempted_req_ids]
        self.worker.wait(barrier + [j for j in meta.flush_jobs if j in self._jobs])

    def begin_step(self, meta: OffloadingConnectorMetadata) -> None:
        """The step's plan is bound, its forward pass about to run: time it (until wait_for_save;
        start_load_kv may come after the forward, as vLLM calls it in steps without sync loads)."""
        self._clock.begin(meta.num_step_tokens)
        self._sync.begin()
        self._step_meta = meta
        for st in self._requests.values():
            st.planned = []  # an earlier step's, never opened: its deferred list still holds them
        for rid, jobs in meta.reqs_to_store.items():
            self._state(rid).planned = list(jobs)
        self._layered_open = False

    def start_load_kv(self, meta: OffloadingConnectorMetadata) -> None:
        for rid in meta.await_finish:
            self._state(rid).awaiting_finish = True
        if meta.cancel_loads:
            assert self.worker is not None
            for job_id in meta.cancel_loads:
                if job_id in self._jobs:
                    self.worker.cancel(job_id)  # reported failed and cancelled; its request recomputes
        self._submit_demotions(meta)
        if meta.flush_jobs:  # stores reading blocks handed out again: done before anything writes them
            self._submit_deferred()
            assert self.worker is not None
            self.worker.wait([j for j in meta.flush_jobs if j in self._jobs])
        t0 = time.perf_counter()
        for rid, jobs in meta.reqs_to_load.items():
            for job in jobs:
                self._submit(job, sync=rid in meta.sync_loads)
                if job.job_id in meta.cancel_loads:  # planned and given up in one step: never read
                    assert self.worker is not None
                    self.worker.cancel(job.job_id)
        if meta.reqs_to_load:
            self._load_requests += len(meta.reqs_to_load)  # reported with the step that ends next
            self._load_host_s += time.perf_counter() - t0
        self._submit_deferred()
        # Those not opened layer by layer (the first save_kv_layer may come later: it takes
        # its stores out of this same list).
        if self._step_meta is meta:
            for st in self._requests.values():
                st.deferred = st.planned
        else:
            for rid, jobs in meta.reqs_to_store.items():
                self._state(rid).deferred = list(jobs)

    def save_kv_layer(self, layer_name: str) -> None:
        """The forward pass has written ``layer_name``'s KV: copy it out of the step's stores."""
        meta = self._step_meta
        if meta is None or not (meta.reqs_to_store or self._layered_open) or not self.layered_stores or self.kv is None:
            return  # most steps (decode) store nothing: nothing to open or copy
        assert self.worker is not None
        if not self._layered_open:
            self._layered_open = True
            # A synchronous load whose outcome only its report tells (no progress record): the
            # step's stores wait for that report, after the step, as in mode async.
            if self._sync.layers_known():
                self._open_layered_stores(meta)
        layer = self.kv.layer_tensors.get(layer_name)
        if layer is not None:
            self.worker.layer_written(layer)

    def _open_layered_stores(self, meta: OffloadingConnectorMetadata) -> None:
        assert self.worker is not None
        self._submit_demotions(meta)  # they fence the host slots a store may take over
        for st in self._requests.values():
            left = []
            for job in st.planned:
                if self.worker.open_layered_store(job.job_id, (job.src, job.dst)):
                    self._jobs[job.job_id] = job
                    st.outstanding += 1
                else:
                    left.append(job)
            st.planned[:] = left  # in place: from start_load_kv on it is also the deferred list

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until this step's synchronous loads have landed ``layer_name``'s KV (all of
        a job that cannot tell layers apart)."""
        if not self._sync:
            return
        assert self.worker is not None and self.kv is not None
        self._sync.wait_layer(self.worker, self.kv.layer_tensors.get(layer_name))

    def wait_for_save(self) -> None:
        """The forward pass is done: this step's synchronous loads are over (an engine that
        skipped a layer's wait still gets them finished here), and the step's time goes back
        to the scheduler half's cost model."""
        if self._sync:
            assert self.worker is not None
            self._sync.wait_all(self.worker)
        # A synchronous load that failed (or could not even be submitted) aborts the step's stores.
        self._end_layered_stores(commit=self._sync.succeeded())
        if self._clock.end(self._sync.blocks, self._sync.wait_s, self._load_requests, self._load_host_s):
            self._load_requests, self._load_host_s = 0, 0.0  # else carried to the next step that computes

    def _end_layered_stores(self, commit: bool) -> None:
        if self._layered_open:
            assert self.worker is not None
            self._layered_open = False
            self.worker.end_layered_stores(commit)
        self._step_meta = None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        recved: set[str] = set()
        if not (self._jobs or self._requests or self._sync.failed):
            return set(), recved  # nothing in flight, nothing owed: most decode steps
        assert self.worker is not None
        for r in self.worker.get_finished():
            job = self._jobs.pop(r.job_id)
            rid = job.req_id
            self.stats.record(r)
            self._results.append(r)
            if rid is None:
                continue
            st = self._state(rid)
            st.outstanding -= 1
            if job.kind is JobKind.LOAD:
                sync = self._sync.landed(r.job_id, r.success)
                self.load_blocks.landed(r.job_id, r.success)
                if not r.success and not sync:
                    st.load_failed = True
                if sync:  # never reported as received
                    self._prune(rid)
                    continue
                st.loads_pending -= 1
                if st.loads_pending <= 0:
                    if st.load_failed:
                        self._report_failed(rid)
                    else:
                        recved.add(rid)
            self._prune(rid)
        if self._sync.failed:
            self._drop_deferred_stores()
        sent = {rid for rid, st in self._requests.items()
                if st.awaiting_finish and st.outstanding <= 0 and not st.deferred}
        for rid in sent:
            self._requests[rid].awaiting_finish = False
            self._prune(rid)
        return sent, recved

    def _drop_deferred_stores(self) -> None:
        """A synchronous load of this step failed: the stores this step planned may hold KV
        computed from its blocks (by the request itself, or one sharing them), so none is
        submitted; each is reported failed (the scheduler half frees its slots)."""
        self._sync.failed = False
        for job in take_deferred(self._requests.values()):
            self._results.append(TransferResult(job.job_id, False, 0, 0.0, DEVICE_TO_HOST))

    def _report_failed(self, rid: str) -> None:
        st = self._state(rid)
        st.load_failed = False
        st.report_failed = True

    def get_failed_recving(self) -> set[str]:
        """Requests whose load failed and whose loads are all done: they recompute."""
        failed = {rid for rid, st in self._requests.items() if st.report_failed}
        for rid in failed:
            self._requests[rid].report_failed = False
            self._prune(rid)
        return failed

    def take_failed_block_ids(self) -> set[int]:
        """Device blocks whose load failed since the last call (their KV must be recomputed)."""
        return self.load_blocks.take()

    def build_connector_worker_meta(self) -> list[TransferResult | StepTiming | LoadReading]:
        """The step's finished copies and timing, and the loads still reading (how long each
        has: the scheduler half judges a tier that slowed down by them before they end)."""
        results: list[TransferResult | StepTiming | LoadReading] = list(self._results)
        self._results = []
        results += self._clock.take()
        if self.worker is not None and self._jobs:
            results += [LoadReading(job_id, r.seconds, r.done, r.piece, r.piece_s)
                        for job_id, r in self.worker.loads_reading().items()]
        return results

    def flush(self) -> None:
        """Submit deferred stores and wait for every outstanding copy."""
        if self.worker is None:
            return
        self._end_layered_stores(commit=False)  # a step that never ended: its KV may be partial
        self._submit_deferred()
        self.worker.wait(list(self._jobs))

    def close(self) -> None:
        if self.worker is not None:
            self.flush()
            self.worker.close()
            self.worker = None

    def stats_dict(self) -> dict[str, DirectionStatsDict]:
        return {d: s.as_dict() for d, s in self.stats.by_direction.items()}
