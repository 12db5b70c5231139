"""Disk-tier copies: CPU slot → disk record (demotion) and disk record → device (load).

Runs on its own small thread pool, off the scheduler's path, and reports through the same
``get_finished`` accounting as device copies. Every read verifies the record header and the
data checksum and the key the ledger expects; a mismatch fails the job and names the bad slots,
so nothing torn, flipped or misplaced is ever copied into the KV cache. I/O errors (disk full,
EIO) fail the job, name the unreadable slot and count against the tier's health.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from kvoffload.offload.disk_format import RECORD_HEADER, DiskLayout, data_checksum, parse_record_header, record_header
from kvoffload.offload.mediums import CPULoadStoreSpec
from kvoffload.transfer.handler import BlockTransferError, TrackedJobsHandler, TransferSpec
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import CanonicalKVCache
from kvoffload.transfer.slot_fence import SlotFences
from kvoffload.transfer.streams import CPUStreamPool
from kvoffload_ext import copy_blocks

HOST_TO_DISK = "host_to_disk"
DISK_TO_DEVICE = "disk_to_device"




class DiskHandler(TrackedJobsHandler):
    def __init__(self, kv: CanonicalKVCache, host: HostBlockBuffer, block_size_factor: int, layout: DiskLayout,
                 path: str | os.PathLike, fences: SlotFences, num_threads: int = 2) -> None:
        if kv.page_bytes * block_size_factor != layout.block_bytes:
            raise ValueError(
                f"disk records hold {layout.block_bytes} bytes but an offloaded block is "
                f"{kv.page_bytes * block_size_factor}; the tier was configured for another layout"
            )
        self.kv = kv
        self.host = host
        self.factor = block_size_factor
        self.layout = layout
        self.path = str(path)
        self.fences = fences
        # O_CREAT: the worker may start before the scheduler side creates and sizes the file
        # (vLLM builds workers first); the scheduler side then writes its header in place.
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.pool = CPUStreamPool(num_threads)
        self.offsets = np.cumsum((0,) + kv.row_bytes[:-1]).tolist()
        super().__init__((HOST_TO_DISK, DISK_TO_DEVICE))

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        src, dst = spec
        if isinstance(src, CPULoadStoreSpec):
            direction = HOST_TO_DISK
            cpu_blocks, disk_slots = src.block_ids.tolist(), dst.block_ids.tolist()
            keys = getattr(dst, "block_hashes", None)
            if len(cpu_blocks) != len(disk_slots) or keys is None or len(keys) != len(disk_slots):
                return False  # a record must name its block hash, or it cannot be recovered
            nbytes = len(disk_slots) * self.layout.block_bytes
            handle = self.pool.submit(direction, lambda: self._demote(cpu_blocks, disk_slots, keys))
            self.fences.mark(cpu_blocks, handle)
        else:
            direction = DISK_TO_DEVICE
            disk_slots, device_ids = src.block_ids.tolist(), dst.block_ids
            expected = getattr(src, "block_hashes", None)
            skip = len(disk_slots) * self.factor - len(device_ids)
            if not 0 <= skip < self.factor or expected is None or len(expected) != len(disk_slots):
                return False  # every record read is checked against the key the ledger expects
            nbytes = len(device_ids) * self.kv.page_bytes
            handle = self.pool.submit(direction, lambda: self._load(disk_slots, list(expected), device_ids, skip))
        self._track(direction, job_id, handle, nbytes)
        return True

    def _demote(self, cpu_blocks: list[int], disk_slots: list[int], keys: list) -> None:
        try:
            for cpu_block, slot, key in zip(cpu_blocks, disk_slots, keys):
                rows = self.host.rows(cpu_block * self.factor, self.factor)
                data = memoryview(rows.numpy().reshape(-1).data)
                header = record_header(key, data_checksum(data))
                written = os.pwritev(self.fd, [header, data], self.layout.offset(slot))
                if written != RECORD_HEADER + len(data):
                    raise OSError(f"short write of slot {slot}: {written} bytes")
        except OSError as exc:
            raise BlockTransferError(f"disk tier {self.path}: write failed: {exc}", [], io=True) from exc

    def _load(self, disk_slots: list[int], expected: list, device_ids: np.ndarray, skip: int) -> None:
        staging = torch.empty((len(disk_slots) * self.factor, self.kv.page_bytes), dtype=torch.uint8)
        bad: list[int] = []
        header = bytearray(RECORD_HEADER)
        for i, (slot, key) in enumerate(zip(disk_slots, expected)):
            block = staging[i * self.factor : (i + 1) * self.factor].numpy().reshape(-1)
            try:
                n = os.preadv(self.fd, [header, block.data], self.layout.offset(slot))
            except OSError as exc:
                raise BlockTransferError(f"disk tier {self.path}: read of slot {slot} failed: {exc}", [slot],
                                         io=True) from exc
            parsed = parse_record_header(bytes(header))
            if n != RECORD_HEADER + len(block) or parsed is None or parsed[1] != data_checksum(block.data):
                bad.append(slot)  # torn, truncated or flipped
            elif parsed[0] != key:
                bad.append(slot)  # an intact record of another block: misplaced, never served
        if bad:
            raise BlockTransferError(f"disk tier {self.path}: records failed their checksum or key check: "
                                     f"slots {bad[:8]}", bad)
        rows = np.arange(skip, len(disk_slots) * self.factor)
        for view, off in zip(self.kv.views, self.offsets):
            copy_blocks(staging[:, off : off + view.shape[1]], view, rows, device_ids)

    def close(self) -> None:
        self.pool.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
