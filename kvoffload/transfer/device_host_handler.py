"""Copies between the device KV cache and host memory, both directions, one handler.

Store (GPU → CPU): every engine block of each offloaded block is copied into the block's
``block_size_factor`` host rows. Load (CPU → GPU): the host rows of the offloaded blocks are
copied into the given device blocks; when the first offloaded block is only partly needed
(its head is already on the device), its leading rows are skipped.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvoffload.offload.mediums import GPULoadStoreSpec
from kvoffload.transfer.handler import TrackedJobsHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.host_tables import HostRowTables, JobPart
from kvoffload.transfer.layer_progress import LayerProgress
from kvoffload.transfer.layered_store import LayeredStore
from kvoffload.transfer.layout import CanonicalKVCache
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE, TransferSpec
from kvoffload.transfer.slot_fence import SlotFences
from kvoffload.transfer.streams import StreamPool
from kvoffload_ext.copies import prepare_copies

#: Jobs (or a layer-wise store's layers) this small run in the caller where the pool allows it
#: (``StreamPool.submit``'s ``inline``): on a CPU, handing a job to a copy thread cost the
#: engine's loop about 50 µs (measured: the thread's wake-up and the GIL's return), the time of
#: a ~100 KB copy; the tiny model's 33 KB jobs made `kvoffload run` 10% slower with offload.
INLINE_BYTES = 128 << 10


class DeviceHostHandler(TrackedJobsHandler):
    def __init__(self, kv: CanonicalKVCache, host: HostBlockBuffer, block_size_factor: int, pool: StreamPool,
                 fences: SlotFences | None = None) -> None:
        if host.row_bytes != kv.page_bytes:
            raise ValueError(f"host rows of {host.row_bytes} bytes cannot hold engine pages of {kv.page_bytes}")
        self.kv = kv
        self.host = host
        self.factor = block_size_factor
        self.pool = pool
        self.fences = fences
        self.tables = HostRowTables(kv, host)
        #: This step's layer-wise stores (open until end_layered_stores).
        self._open: list[LayeredStore] = []
        # Stores go layer by layer only where each KV tensor is one named layer's: a tensor
        # shared by several layers (vLLM's hybrid allocator gives one layer of each group the
        # same tensor) is written at several points of the forward pass, and copying it when
        # its first layer is saved would store KV not yet computed. Such caches store whole.
        # And only on the CPU backend: on CUDA a whole store is already off the forward pass
        # (a copy stream, issued after the step), while issuing it layer by layer costs the host
        # a submission per layer and store inside the forward pass (on an H100, 8 layers and 2
        # stores a step: 5.5 ms of host time a step, against 2.5 whole and 1.6 without stores).
        tensors = kv.layer_tensors
        self._layered = kv.device.type == "cpu" and bool(tensors) and len(set(tensors.values())) == len(tensors)
        prepare_copies(kv.device, {int(view.shape[1]) for view in kv.views})
        super().__init__((DEVICE_TO_HOST, HOST_TO_DEVICE))

    def _host_rows(self, host_blocks: np.ndarray) -> np.ndarray:
        if self.factor == 1:
            return host_blocks  # an offloaded block is one engine block: its row is its slot
        return (host_blocks[:, None] * self.factor + np.arange(self.factor)[None, :]).reshape(-1)

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        src, dst = spec
        host_blocks: np.ndarray | None = None
        if isinstance(src, GPULoadStoreSpec):
            direction = DEVICE_TO_HOST
            device_ids = src.block_ids
            host_blocks = dst.block_ids
            host_rows = self._host_rows(host_blocks)
        else:
            direction = HOST_TO_DEVICE
            device_ids = dst.block_ids
            host_rows = self._host_rows(src.block_ids)
            skip = len(host_rows) - len(device_ids)
            if not 0 <= skip < self.factor:
                return False
            host_rows = host_rows[skip:]
        if len(host_rows) != len(device_ids):
            return False
        fenced = host_blocks.tolist() if host_blocks is not None else None
        self.submit_rows(job_id, direction, device_ids, host_rows, fenced)
        return True

    def submit_rows(self, job_id: int, direction: str, device_ids: np.ndarray, host_rows: np.ndarray,
                    fenced_slots: list[int] | None = None) -> None:
        """Copy device block ``device_ids[i]`` to/from host row ``host_rows[i]`` as one job.

        The row-level entry point for adapters whose specs carry their own chunk geometry
        (vLLM's OffloadingConnector); ``fenced_slots`` are host blocks a demotion may still read.
        """
        if len(host_rows) != len(device_ids):
            raise ValueError(f"{len(host_rows)} host rows for {len(device_ids)} device blocks")
        nbytes = len(device_ids) * self.kv.page_bytes
        fences = self.fences if fenced_slots else None
        progress = None
        if direction == HOST_TO_DEVICE and self.kv.layer_tensors:
            progress = self._watch(job_id, self.kv.num_tensors, self.kv.device.type == "cuda")

        def run() -> None:
            ok = False
            try:
                if fences is not None and fenced_slots:
                    fences.wait(fenced_slots)  # a demotion may still be reading these slots
                self._copy(direction, device_ids, host_rows, progress)
                ok = True
            finally:
                if progress is not None:
                    progress.release(failed=not ok)

        inline = nbytes <= INLINE_BYTES and (fences is None or not fenced_slots or fences.clear(fenced_slots))
        self._track(direction, job_id, self.pool.submit(direction, run, inline), nbytes)

    def open_layered_store(self, job_id: int, spec: TransferSpec) -> bool:
        src, dst = spec
        if not isinstance(src, GPULoadStoreSpec) or not self._layered:
            return False
        host_blocks = dst.block_ids
        host_rows = self._host_rows(host_blocks)
        if len(host_rows) != len(src.block_ids):
            return False
        parts = self.tables.parts(DEVICE_TO_HOST, src.block_ids, host_rows)
        fenced, tables = host_blocks.tolist(), self.tables
        # Demotions reading these slots were submitted before any store opens; none comes later:
        # slots clear now stay clear, and the layers' copies need not look again.
        fences = None if self.fences is None or self.fences.clear(fenced) else self.fences

        def copy_layer(layer: int) -> Callable[[], None]:
            def run() -> None:
                if fences is not None:
                    fences.wait(fenced)  # a demotion may still be reading these slots
                tables.copy_layer(DEVICE_TO_HOST, parts, layer)
            return run

        nbytes = len(src.block_ids) * self.kv.page_bytes
        layers = tables.num_layers
        inline = nbytes // layers <= INLINE_BYTES and fences is None
        store = LayeredStore([copy_layer(k) for k in range(layers)], self.pool, DEVICE_TO_HOST, inline)
        self._open.append(store)
        self._track(DEVICE_TO_HOST, job_id, store, nbytes)
        return True

    def layer_written(self, layer: int) -> None:
        for store in self._open:
            store.layer_written(layer)

    def end_layered_stores(self, commit: bool) -> None:
        stores, self._open = self._open, []
        for store in stores:
            store.end(commit)

    def _copy(self, direction: str, device_ids: np.ndarray, host_rows: np.ndarray,
              progress: LayerProgress | None = None) -> None:
        """Stores: every view and host chunk in one batched copy (one kernel launch on CUDA).
        Loads: one batched copy per layer, in layer order, each marked as it lands."""
        parts: list[JobPart] = self.tables.parts(direction, device_ids, host_rows)
        if progress is None:
            self.tables.copy_whole(direction, parts)
            return
        for layer in range(self.tables.num_layers):
            self.tables.copy_layer(direction, parts, layer)
            progress.landed(layer)

    def close(self) -> None:
        self.pool.close()
