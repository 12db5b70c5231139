"""CPU block copies: a native loop of memcpy per run of consecutive rows.

Measured on this project's 2-core machine, torch ``index_copy_``/``index_select`` and numpy
fancy indexing on uint8 rows move 0.6-1.6 GB/s; a memcpy per row runs close to one
contiguous copy. The loop is compiled C when a compiler exists (``native.py``), else a
ctypes memmove per row. ctypes releases the GIL, so copy threads overlap with compute.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from kvoffload_ext.native import native_lib

_memmove = ctypes.memmove
_NUM_THREADS = min(4, os.cpu_count() or 1)
_SPLIT_BYTES = 4 << 20
_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max(1, _NUM_THREADS - 1), thread_name_prefix="kvoffload-memcpy")
    return _executor


def copy_blocks_cpu(src: torch.Tensor, dst: torch.Tensor, src_ids: np.ndarray, dst_ids: np.ndarray) -> None:
    lib = native_lib()
    if lib is None:
        copy_blocks_memmove(src, dst, src_ids, dst_ids)
        return
    s_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
    d_ids = np.ascontiguousarray(dst_ids, dtype=np.int64)
    row = src.shape[1]

    def run(lo: int, hi: int) -> None:
        lib.kvo_copy_rows(src.data_ptr(), src.stride(0), dst.data_ptr(), dst.stride(0), row,
                          s_ids[lo:].ctypes.data, d_ids[lo:].ctypes.data, hi - lo)

    n = len(s_ids)
    parts = min(_NUM_THREADS, max(1, n * row // _SPLIT_BYTES))
    if parts == 1:
        run(0, n)
        return
    # Large copies are split across threads: one core's memcpy does not saturate memory.
    bounds = [n * k // parts for k in range(parts + 1)]
    futures = [_pool().submit(run, bounds[k], bounds[k + 1]) for k in range(1, parts)]
    run(bounds[0], bounds[1])
    for f in futures:
        f.result()


def copy_blocks_memmove(src: torch.Tensor, dst: torch.Tensor, src_ids: np.ndarray, dst_ids: np.ndarray) -> None:
    """Pure-Python fallback: one ctypes memmove per run of consecutive rows."""
    row = src.shape[1]
    s_base, s_stride = src.data_ptr(), src.stride(0)
    d_base, d_stride = dst.data_ptr(), dst.stride(0)
    s_list, d_list = src_ids.tolist(), dst_ids.tolist()
    # Runs where both sides advance by one row and rows are packed become one memmove.
    packed = s_stride == row and d_stride == row
    i, n = 0, len(s_list)
    while i < n:
        j = i + 1
        if packed:
            while j < n and s_list[j] == s_list[j - 1] + 1 and d_list[j] == d_list[j - 1] + 1:
                j += 1
        _memmove(d_base + d_list[i] * d_stride, s_base + s_list[i] * s_stride, row * (j - i))
        i = j
