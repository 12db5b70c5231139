"""KVOffloadWorker: kvoffload's copy engine behind vLLM's ``OffloadingWorker`` contract.

vLLM hands the worker its KV cache already reduced to ``(num_blocks, page_bytes)`` int8
views (``CanonicalKVCaches``) and, per job, a GPU spec (block ids, the first block's index in
the request) and a CPU spec (chunk ids; a chunk is ``blocks_per_chunk`` engine blocks).
This module turns those into host rows and device blocks and submits them to kvoffload's
``DeviceHostHandler``, which runs on CPU copy threads or CUDA streams, whichever the KV cache
lives on — so it also works on vLLM's CPU backend, where vLLM's stock CPU worker refuses.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from kvoffload.transfer.device_host_handler import DeviceHostHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import CanonicalKVCache, LayoutError
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE
from kvoffload.transfer.streams import make_stream_pool

logger = logging.getLogger("vllm.kvoffload")


def canonical_from_vllm(kv_caches: CanonicalKVCaches) -> CanonicalKVCache:
    """One uint8 view per vLLM tensor, cut to the bytes its layers really use (no padding).
    A hybrid model's groups overlay the same tensors (a block id belongs to one group), so a
    row of every view is one block of whichever group owns it."""
    if not kv_caches.group_data_refs:
        raise LayoutError("vLLM registered no KV-cache groups")
    used = [0] * len(kv_caches.tensors)
    for refs in kv_caches.group_data_refs:
        for ref in refs:
            used[ref.tensor_idx] = max(used[ref.tensor_idx], ref.page_size_bytes)
    views = []
    for t, width in zip(kv_caches.tensors, used):
        if width == 0:
            continue
        tensor = t.tensor.view(torch.uint8) if t.tensor.dtype != torch.uint8 else t.tensor
        views.append(tensor[:, :width])
    num_blocks = int(views[0].shape[0])
    return CanonicalKVCache(tuple(views), num_blocks)


class KVOffloadWorker(OffloadingWorker):
    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int,
                 backend: str = "auto", num_streams: int = 4) -> None:
        self.kv = canonical_from_vllm(kv_caches)
        self.factor = blocks_per_chunk
        device = self.kv.device
        self.host = HostBlockBuffer(num_chunks * blocks_per_chunk, self.kv.page_bytes, pin=device.type == "cuda",
                                    row_multiple=blocks_per_chunk)
        pool = make_stream_pool(backend, device, num_streams)
        self.handler = DeviceHostHandler(self.kv, self.host, blocks_per_chunk, pool)
        logger.info("kvoffload: %d vLLM block tensors -> %d block views, %d bytes per block, %d chunks of %d blocks",
                    len(kv_caches.tensors), len(self.kv.views), self.kv.page_bytes, num_chunks, blocks_per_chunk)

    def _rows(self, gpu: GPULoadStoreSpec, chunks: LoadStoreSpec) -> tuple[np.ndarray, np.ndarray]:
        """(device blocks, host rows), group by group (``group_sizes`` device blocks each, their
        chunks in the same order): chunk rows, less the first chunk's leading blocks the request
        already has (``block_indices[g] % blocks_per_chunk``), cut to the group's count."""
        if not isinstance(chunks, BlockIDsLoadStoreSpec):
            raise TypeError(f"KVOffloadWorker got a {type(chunks).__name__}; expected chunk ids from KVOffloadManager")
        device_ids = np.asarray(gpu.block_ids, dtype=np.int64)
        chunk_ids = np.asarray(chunks.block_ids, dtype=np.int64)
        sizes = list(gpu.group_sizes) if gpu.group_sizes is not None else [len(device_ids)]
        firsts = list(gpu.block_indices) if gpu.block_indices is not None and len(gpu.block_indices) else [0] * len(sizes)
        f = self.factor
        parts: list[np.ndarray] = []
        used_chunks = 0
        for size, first in zip(sizes, firsts):
            if size == 0:
                continue
            skip = int(first) % f
            count = -(-(size + skip) // f)
            group_chunks = chunk_ids[used_chunks : used_chunks + count]
            used_chunks += count
            rows = (group_chunks[:, None] * f + np.arange(f)[None, :]).reshape(-1)[skip : skip + size]
            if len(rows) != size:
                raise ValueError(f"{len(group_chunks)} chunks cannot hold {size} blocks after skipping {skip}")
            parts.append(rows)
        if used_chunks != len(chunk_ids) or sum(sizes) != len(device_ids):
            raise ValueError(f"{len(chunk_ids)} chunks for groups of {sizes} blocks: the GPU and host specs disagree")
        return device_ids, np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        device_ids, rows = self._rows(src_spec, dst_spec)
        self.handler.submit_rows(job_id, DEVICE_TO_HOST, device_ids, rows)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        device_ids, rows = self._rows(dst_spec, src_spec)
        self.handler.submit_rows(job_id, HOST_TO_DEVICE, device_ids, rows)
        return True

    def get_finished(self) -> list[TransferResult]:
        return [TransferResult(job_id=r.job_id, success=r.success, transfer_size=r.nbytes, transfer_time=r.seconds)
                for r in self.handler.get_finished()]

    def wait(self, job_ids: set[int]) -> None:
        self.handler.wait(job_ids)

    def shutdown(self) -> None:
        self.handler.close()
