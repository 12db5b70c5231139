"""CPU block copies: one native memcpy loop over a job's byte ranges.

Measured on this project's 2-core machine, torch ``index_copy_``/``index_select`` and numpy
fancy indexing on uint8 rows move 0.6-1.6 GB/s; a memcpy per range runs close to one
contiguous copy. The loop is compiled C when a compiler exists (``native.py``), else a
ctypes memmove per range. ctypes releases the GIL, so copy threads overlap with compute.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kvoffload_ext.copies.host_loop import native_lib

_memmove = ctypes.memmove
#: Threads one large host copy is split across (the caller's plus a pool's).
COPY_THREADS = min(4, os.cpu_count() or 1)
#: A host copy is split across threads once it has two such parts.
SPLIT_BYTES = 4 << 20
_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max(1, COPY_THREADS - 1), thread_name_prefix="kvoffload-memcpy")
    return _executor


def copy_ranges_cpu(src: np.ndarray, dst: np.ndarray, lens: np.ndarray) -> None:
    """Copy ``lens[i]`` bytes from address ``src[i]`` to ``dst[i]`` for every i."""
    lib = native_lib()
    if lib is None:
        copy_ranges_memmove(src, dst, lens)
        return
    src, dst, lens = (np.ascontiguousarray(a, dtype=np.int64) for a in (src, dst, lens))

    def run(lo: int, hi: int) -> None:
        lib.kvo_copy_ranges(src[lo:].ctypes.data, dst[lo:].ctypes.data, lens[lo:].ctypes.data, hi - lo)

    n, total = len(lens), int(lens.sum())
    parts = min(COPY_THREADS, n, max(1, total // SPLIT_BYTES))
    if parts <= 1:
        run(0, n)
        return
    # Large copies are split across threads (one core's memcpy does not saturate memory), at
    # range boundaries that share the bytes out evenly.
    cum = np.cumsum(lens)
    bounds = [0, *np.searchsorted(cum, [total * k // parts for k in range(1, parts)]).tolist(), n]
    futures = [_pool().submit(run, bounds[k], bounds[k + 1]) for k in range(1, parts) if bounds[k] < bounds[k + 1]]
    run(bounds[0], bounds[1])
    for f in futures:
        f.result()


def copy_ranges_memmove(src: np.ndarray, dst: np.ndarray, lens: np.ndarray) -> None:
    """Pure-Python fallback: one ctypes memmove per range."""
    for s, d, n in zip(src.tolist(), dst.tolist(), lens.tolist()):
        _memmove(d, s, n)
