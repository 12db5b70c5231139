"""Drive the engine scheduler + the real connector halves with a recording fake handler."""

from __future__ import annotations

from types import SimpleNamespace

from kvoffload.connector.base import KVConnectorOutput, KVConnectorRole
from kvoffload.connector.offloading_connector import OffloadingConnector
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.offload.spec import EngineKVInfo
from kvoffload.transfer.handler import OffloadingHandler, TransferRouter
from kvoffload.transfer.layer_progress import LayerProgress
from kvoffload.transfer.result import TransferResult
from tests.engine.helpers import make_scheduler

#: The fake model's attention layers.
LAYERS = ("layer.0", "layer.1")


class FakeHandler(OffloadingHandler):
    """Records every job; jobs finish only when the test says so (or on wait)."""

    #: Loads come with a progress record (landed at once, failed unless ``wait_success``), as
    #: the real handlers give; False: none, so the worker learns a load's outcome from its report.
    progress = False

    def __init__(self) -> None:
        self.submitted: list[tuple[int, str, list[int], list[int]]] = []  # (job, kind, src ids, dst ids)
        self.done: list[TransferResult] = []
        self.pending: dict[int, str] = {}
        self.waited: list[list[int]] = []
        self.auto_complete = False
        #: Jobs finished by a wait succeed (False: they fail, as a bad read would).
        self.wait_success = True
        #: Stores taken layer by layer (False: refused, as a handler that copies only whole).
        self.layered = True
        #: Loads refused at submission (a geometry or key mismatch).
        self.refuse_loads = False
        #: Layer-wise stores of the running step, the layers written, and each step's verdict.
        self.open: list[int] = []
        self.layers_written: list[int] = []
        self.verdicts: list[tuple[list[int], bool]] = []

    def transfer_async(self, job_id, spec):
        src, dst = spec
        kind = "store" if isinstance(src, GPULoadStoreSpec) else "load"
        if kind == "load" and self.refuse_loads:
            return False
        self.submitted.append((job_id, kind, src.block_ids.tolist(), dst.block_ids.tolist()))
        self.pending[job_id] = kind
        if self.auto_complete:
            self.complete([job_id])
        return True

    def open_layered_store(self, job_id, spec):
        if not self.layered:
            return False
        src, dst = spec
        self.submitted.append((job_id, "store", src.block_ids.tolist(), dst.block_ids.tolist()))
        self.pending[job_id] = "store"
        self.open.append(job_id)
        return True

    def layer_progress(self, job_id):
        if not self.progress or self.pending.get(job_id) != "load":
            return None
        progress = LayerProgress(len(LAYERS))
        progress.release(failed=not self.wait_success)
        return progress

    def layer_written(self, layer):
        if self.open:
            self.layers_written.append(layer)

    def end_layered_stores(self, commit):
        stores, self.open = self.open, []
        self.verdicts.append((stores, commit))
        if not commit:  # aborted: reported failed, as the real handler does once its copies are over
            self.complete(stores, success=False)
        elif self.auto_complete:
            self.complete(stores)

    def wait(self, job_ids):
        assert not set(job_ids) & set(self.open), "a layer-wise store waited for before its step ended"
        ids = [j for j in job_ids if j in self.pending]
        self.waited.append(ids)
        self.complete(ids, self.wait_success)

    def complete(self, job_ids, success=True):
        for j in job_ids:
            kind = self.pending.pop(j)
            direction = "device_to_host" if kind == "store" else "host_to_device"
            self.done.append(TransferResult(j, success, 1, 0.001, direction))

    def jobs(self, kind):
        return [j for j, k, _, _ in self.submitted if k == kind]

    def get_finished(self):
        out, self.done = self.done, []
        return out



class Harness:
    def __init__(self, num_blocks=64, block_size=4, tier_blocks=16, factor=1, threshold=0, budget=64, max_seqs=8,
                 policy="lru", load_mode="async", vllm_order=False):
        """``load_mode``: async by default, the mode these tests were written for (a load lands
        when the test completes its job); ``layerwise`` loads inside the step (its wait_for_save
        finishes them)."""
        kv_info = EngineKVInfo(block_size=block_size, block_bytes=100, num_device_blocks=num_blocks)
        cfg = {"tiers": [{"medium": "cpu", "capacity": tier_blocks * 100 * factor, "eviction_policy": policy}],
               "offloaded_block_size": block_size * factor, "load_mode": load_mode}
        self.sched_conn = OffloadingConnector(cfg, KVConnectorRole.SCHEDULER, kv_info=kv_info)
        self.worker_conn = OffloadingConnector(cfg, KVConnectorRole.WORKER, kv_info=kv_info)
        self.handler = FakeHandler()
        worker = TransferRouter()
        worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, self.handler)
        worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, self.handler)
        self.worker_conn.connector_worker.worker = worker
        #: The worker maps a layer's name to its KV tensor through the canonical cache.
        self.worker_conn.connector_worker.kv = SimpleNamespace(layer_tensors={name: i for i, name in enumerate(LAYERS)})
        #: vLLM's order: in a step without synchronous loads, start_load_kv comes after the forward.
        self.vllm_order = vllm_order
        self.sched = make_scheduler(num_blocks=num_blocks, block_size=block_size, budget=budget, max_seqs=max_seqs,
                                    connector=self.sched_conn)
        self.manager = self.sched_conn.connector_scheduler.manager
        self.outputs = []

    @property
    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def step(self, abort_before_update=()):
        """One engine step. ``abort_before_update``: request ids aborted after the worker ran
        and before its report is digested (where vLLM handles client aborts)."""
        so = self.sched.schedule()
        meta = so.kv_connector_metadata
        w = self.worker_conn
        w.bind_connector_metadata(meta)
        w.handle_preemptions(meta)
        after_forward = self.vllm_order and not meta.sync_loads
        if not after_forward:
            w.start_load_kv()
        for name in LAYERS:  # the forward pass: each layer waits for its load, then is saved
            w.wait_for_layer_load(name)
            w.save_kv_layer(name, None)
        if after_forward:
            w.start_load_kv()
        w.wait_for_save()
        sent, recved = w.get_finished(so.finished_req_ids)
        invalid = w.get_block_ids_with_load_errors()
        out = KVConnectorOutput(set(sent), set(recved), w.get_failed_recving(), w.build_connector_worker_meta())
        w.clear_connector_metadata()
        ids, sampled, rolled_back = [], [], {}
        for rid, n in so.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            ids.append(rid)
            blocks = self.sched.kv_cache_manager.get_block_ids(rid)[0]
            bad = [i for i, b in enumerate(blocks) if b in invalid]
            if bad:  # as the model runner: keep the KV before the first unfilled block
                rolled_back[rid] = min(req.num_computed_tokens - n, bad[0] * self.sched.block_size)
                sampled.append([])
                continue
            sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
        for rid in abort_before_update:
            self.sched.abort_request(rid)
        self.sched.update_from_output(so, ModelRunnerOutput(ids, sampled, kv_connector_output=out,
                                                            rolled_back=rolled_back))
        self.outputs.append(so)
        return so

    def run_until_idle(self, max_steps=200):
        for _ in range(max_steps):
            if not self.sched.has_unfinished_requests() and not self.sched.has_pending_frees():
                return
            self.handler.complete(list(self.handler.pending))
            self.step()
        raise AssertionError("harness did not become idle")
