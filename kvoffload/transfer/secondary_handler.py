"""SecondaryTierHandler: every copy into or out of one secondary tier, over its TierIO.

- host → tier: a victim (or written-through block) of the host tier, staged out of its host
  slots (so they are free again at memory speed) and written from there;
- tier above → tier: a victim of the secondary tier above, staged through a scratch buffer;
- tier → device: a load, staged and copied into the device blocks (promotion into the host
  tier is the connector's store that follows).
Copies run on the tier's own threads and report through the same ``get_finished`` accounting
as device copies. Fences order them: a copy reading a slot (host or tier) marks it, and a
later copy writing that slot waits for the mark, so a victim's bytes leave before its slot is
reused (a host slot's mark is the staging copy's, not the tier write's).

A load can be cancelled (``cancel``) until it begins writing the device blocks: it reads in
pieces of about ``READ_PIECE_BYTES`` and stops between them, so a load given up on a tier that
slowed down holds the tier's load lane one piece longer at most.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np
import torch

from kvoffload.offload.abstract import BlockHash, Medium, SlotIds
from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec, KeyedLoadStoreSpec
from kvoffload.transfer.backpressure import StoreBackpressure
from kvoffload.transfer.handler import TrackedJobsHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import CanonicalKVCache
from kvoffload.transfer.result import BlockTransferError, LoadCancelled, ReadProgress, StoreSkipped, TransferSpec
from kvoffload.transfer.slot_fence import SlotFences
from kvoffload.transfer.streams import DirectionLanes, JobHandle, failed_handle
from kvoffload.transfer.tier_io import TierIO
from kvoffload_ext import copy_block_groups

logger = logging.getLogger(__name__)
#: Tiers whose skipped stores were logged (by name): one line a tier per process.
_SKIPS_LOGGED: set[str] = set()

#: A load reads this much at a time (at least a block), checking for cancellation in between.
READ_PIECE_BYTES = 1 << 20


class _LoadToken:
    """Whether a load was cancelled, and whether it began writing (then it cannot be)."""

    __slots__ = ("began", "cancelled", "lock", "piece_began", "pieces", "read", "writing")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.writing = False
        #: When its thread began reading it (None: still queued); its pieces, and those read.
        self.began: float | None = None
        self.pieces = 1
        self.read = 0
        self.piece_began = 0.0

    def cancel(self) -> bool:
        with self.lock:
            if self.writing:
                return False
            self.cancelled = True
            return True

    def check(self) -> None:
        if self.cancelled:
            raise LoadCancelled()

    def begin_writing(self) -> None:
        with self.lock:
            self.check()
            self.writing = True


def copy_direction(src: str, dst: str) -> str:
    """The name a copy's results and stats go under: host_to_disk, disk_to_device, ..."""
    names = {Medium.CPU: "host", Medium.GPU: "device"}
    return f"{names.get(Medium(src), src.lower())}_to_{names.get(Medium(dst), dst.lower())}"


class SecondaryTierHandler(TrackedJobsHandler):
    def __init__(self, medium: Medium, io: TierIO, kv: CanonicalKVCache, host: HostBlockBuffer, block_size_factor: int,
                 block_bytes: int, host_fences: SlotFences, tier_fences: SlotFences,
                 upstream: Mapping[Medium, tuple[TierIO, SlotFences]] | None = None,
                 store_latency_bound_s: float | None = None) -> None:
        if kv.page_bytes * block_size_factor != block_bytes:
            raise ValueError(
                f"{io.name} holds {block_bytes}-byte blocks but an offloaded block is "
                f"{kv.page_bytes * block_size_factor}; the tier was configured for another layout"
            )
        self.medium = medium
        self.io = io
        self.kv = kv
        self.host = host
        self.factor = block_size_factor
        self.block_bytes = block_bytes
        self.host_fences = host_fences
        self.tier_fences = tier_fences
        #: The secondary tier(s) whose victims this tier takes: their I/O and slot fences.
        self.upstream = dict(upstream or {})
        for chunk in host.chunks:  # victims leave from here: let the tier copy them in place
            io.register_memory(chunk.data_ptr(), chunk.numel() * chunk.element_size())
        self.pool = DirectionLanes()  # loads never wait behind stores
        self.backpressure = StoreBackpressure(store_latency_bound_s)
        self.from_host = copy_direction(Medium.CPU, medium)
        self.staging = f"{self.from_host}:staging"  # a lane of its own, not a reported direction
        self.to_device = copy_direction(medium, Medium.GPU)
        directions = [self.from_host, self.to_device, *(copy_direction(m, medium) for m in self.upstream)]
        super().__init__(tuple(directions))
        #: Loads submitted and not over: their cancellation tokens.
        self._tokens: dict[int, _LoadToken] = {}

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        src, dst = spec
        if isinstance(dst, GPULoadStoreSpec) and isinstance(src, KeyedLoadStoreSpec):
            slots, keys, device_ids = src.block_ids.tolist(), src.block_hashes, dst.block_ids
            skip = len(slots) * self.factor - len(device_ids)
            if not 0 <= skip < self.factor or keys is None or len(keys) != len(slots):
                return False  # every record read is checked against the key the ledger expects
            expected = list(keys)
            # Whole-job progress: a reader waits for all of it, and learns whether it failed.
            progress = self._watch(job_id, self.kv.num_tensors, False)
            token = self._tokens[job_id] = _LoadToken()

            def load() -> None:
                ok = False
                try:
                    self._load(slots, expected, device_ids, skip, token)
                    ok = True
                finally:
                    self._tokens.pop(job_id, None)
                    progress.release(failed=not ok)

            handle = self.pool.submit(self.to_device, load)
            self._track(self.to_device, job_id, handle, len(device_ids) * self.kv.page_bytes)
            return True
        if not isinstance(dst, KeyedLoadStoreSpec):
            return False
        dst_slots, keys = dst.block_ids.tolist(), dst.block_hashes
        if keys is None or len(keys) != len(dst_slots) or len(src) != len(dst_slots):
            return False  # a record must name its block hash, or it cannot be recovered
        keys = list(keys)
        nbytes = len(dst_slots) * self.block_bytes
        if isinstance(src, CPULoadStoreSpec):
            host_blocks = src.block_ids.tolist()
            if not self._admit(self.from_host, job_id):
                return True
            # The victims' bytes are staged out of their host slots first, on a lane of their
            # own: the slots are free for the stores taking them over as soon as that memcpy is
            # done, however long this tier takes to write.
            staging = np.empty((len(host_blocks), self.block_bytes), dtype=np.uint8)
            staged = self.pool.submit(self.staging, lambda: self._stage(host_blocks, staging))
            self.host_fences.mark(host_blocks, staged)
            handle = self._submit_store(self.from_host, nbytes, lambda: self._write_staged(staged, staging, dst_slots,
                                                                                          keys))
            self._track(self.from_host, job_id, handle, nbytes)
            return True
        up = self.upstream.get(src.medium())
        if up is None or not isinstance(src, KeyedLoadStoreSpec):
            return False
        direction = copy_direction(src.medium(), self.medium)
        src_slots = src.block_ids.tolist()
        if not self._admit(direction, job_id):
            return True
        handle = self._submit_store(direction, nbytes, lambda: self._from_tier(up[0], src_slots, dst_slots, keys))
        up[1].mark(src_slots, handle)
        self._track(direction, job_id, handle, nbytes)
        return True

    def _admit(self, direction: str, job_id: int) -> bool:
        """Backpressure: a store the tier is too slow to take now finishes at once, skipped."""
        if self.backpressure.admit():
            return True
        if self.io.name not in _SKIPS_LOGGED:  # one line a tier per process, however many handlers serve it
            _SKIPS_LOGGED.add(self.io.name)
            bp = self.backpressure
            logger.warning("kvoffload: %s: stores skipped while they run late (%s: %g ms per MiB + %g ms per store, "
                           "queueing included); counted in kvoffload_tier_stores_skipped_total, the blocks stay in "
                           "the tiers above (logged once)", self.io.name, bp.why_late(), (bp.s_per_mib or 0.0) * 1e3,
                           bp.per_job_s * 1e3)
        self._track(direction, job_id, failed_handle(StoreSkipped(self.io.name)), 0)
        return False

    def _submit_store(self, direction: str, nbytes: int, write: Callable[[], None]) -> JobHandle:
        token = self.backpressure.started(nbytes)

        def timed() -> None:
            try:
                write()
            finally:
                self.backpressure.finished(token)

        return self.pool.submit(direction, timed)

    def _stage(self, host_blocks: list[int], staging: np.ndarray) -> None:
        for row, b in zip(staging, host_blocks):
            row[:] = self.host.rows(b * self.factor, self.factor).numpy().reshape(-1)

    def _write_staged(self, staged: JobHandle, staging: np.ndarray, slots: list[int], keys: list[BlockHash]) -> None:
        staged.wait()
        err = staged.error()
        if err is not None:
            raise err
        self.tier_fences.wait(slots)  # a victim in these slots is read out first
        self.io.write([row.data for row in staging], slots, keys)

    def _from_tier(self, src_io: TierIO, src_slots: list[int], slots: list[int], keys: list[BlockHash]) -> None:
        staging = np.empty((len(slots), self.block_bytes), dtype=np.uint8)
        views = [row.data for row in staging]
        src_io.read(src_slots, keys, views)
        self.tier_fences.wait(slots)
        self.io.write(views, slots, keys)

    def loads_reading(self) -> dict[int, ReadProgress]:
        now = time.monotonic()
        return {job_id: ReadProgress(now - token.began, token.read / token.pieces, 1 / token.pieces,
                                     now - token.piece_began)
                for job_id, token in list(self._tokens.items())
                if token.began is not None and not token.writing and not token.cancelled}

    def cancel(self, job_id: int) -> bool:
        token = self._tokens.get(job_id)
        if token is None or not token.cancel():
            return False
        with self._lock:
            if job_id not in self._by_id:
                return False
            self._cancelled.add(job_id)
        return True

    def _read(self, slots: list[int], keys: list[BlockHash], views: list[memoryview], token: _LoadToken) -> None:
        """The job's records in pieces, stopping between them once cancelled; bad records of
        every piece are reported together (an I/O error stops at once)."""
        step = max(1, READ_PIECE_BYTES // self.block_bytes)
        failed: list[BlockTransferError] = []
        for lo in range(0, len(slots), step):
            token.check()
            try:
                self.io.read(slots[lo : lo + step], keys[lo : lo + step], views[lo : lo + step])
            except BlockTransferError as exc:
                if exc.io:
                    raise
                failed.append(exc)
            token.piece_began = time.monotonic()
            token.read += 1
        if len(failed) == 1:
            raise failed[0]
        if failed:
            bad = [slot for exc in failed for slot in exc.slots]
            reasons = sum((Counter(exc.reasons) for exc in failed), Counter())
            raise BlockTransferError(f"{self.io.name}: records failed their checks ({dict(reasons)}): slots {bad[:8]}",
                                     bad, reasons=dict(reasons))

    def _load(self, slots: list[int], keys: list[BlockHash], device_ids: SlotIds, skip: int,
              token: _LoadToken) -> None:
        token.check()
        token.pieces = max(1, -(-len(slots) // max(1, READ_PIECE_BYTES // self.block_bytes)))  # as _read reads
        token.began = token.piece_began = time.monotonic()
        cuda = self.kv.device.type == "cuda"
        # On CUDA the staging is pinned (the copy kernel reads it through its mapped address).
        staging = torch.empty((len(slots) * self.factor, self.kv.page_bytes), dtype=torch.uint8, pin_memory=cuda)
        views = [memoryview(staging[i * self.factor : (i + 1) * self.factor].numpy().reshape(-1).data)
                 for i in range(len(slots))]
        self._read(slots, keys, views, token)
        token.begin_writing()
        rows = np.arange(skip, len(slots) * self.factor)
        groups = [(staging[:, off : off + view.shape[1]], view, rows, device_ids)
                  for view, off in zip(self.kv.views, self.kv.row_offsets)]
        if not cuda:
            copy_block_groups(groups)
            return
        # This runs on a tier thread: copy on a stream of its own and wait for it, so the job is
        # done only when the bytes are on the device (and the staging outlives the copy).
        stream = torch.cuda.Stream(self.kv.device)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream):
            copy_block_groups(groups)
        stream.synchronize()

    def close(self) -> None:
        self.pool.close()
        self.io.close()
