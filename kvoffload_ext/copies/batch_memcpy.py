"""Many (src, dst, length) copies in one driver call: ``cuMemcpyBatchAsync`` (CUDA 12.8+).

The driver splits the batch over its copy engines itself, so the host issues one call for a
job's rows instead of one ``cudaMemcpyAsync`` each, and no SM is taken. Resolved once per
process through ``cuda.bindings`` (``cuGetProcAddress`` with the 12.8 ABI, the one that still
takes a ``failIdx``); None when the bindings, the driver or the symbol are missing, which the
choice of copy methods (``copy_methods``) reports as "unavailable". Only imported where CUDA is in use.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

#: Source read in stream order: a store's source is device memory that compute queued before it
#: may still be writing; a load's is a host row whose slot may be reused after the job.
SRC_ACCESS_ORDER_STREAM = 1
#: The ABI asked of cuGetProcAddress: 12.8's, with ``failIdx`` (13.0 renamed it ``_v2``).
_ABI_VERSION = 12080


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [("src_access_order", ctypes.c_uint), ("src_loc_hint", _MemLocation),
                ("dst_loc_hint", _MemLocation), ("flags", ctypes.c_uint)]


_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p)


class BatchMemcpyError(RuntimeError):
    """The driver refused a batch (its CUresult and the first failing copy's index)."""


_lock = threading.Lock()
_resolved = False
_fn = None
_why = ""


def _resolve() -> None:
    global _resolved, _fn, _why
    with _lock:
        if _resolved:
            return
        _resolved = True
        try:
            from cuda.bindings import driver
        except ImportError:
            _why = "cuda.bindings is not installed (pip install cuda-python)"
            return
        try:
            err, ptr, _ = driver.cuGetProcAddress(b"cuMemcpyBatchAsync", _ABI_VERSION, 0)
        except Exception as exc:  # noqa: BLE001 - an older binding without the call, or no driver
            _why = f"cuGetProcAddress failed: {exc}"
            return
        if err != driver.CUresult.CUDA_SUCCESS or not int(ptr):
            _why = f"the driver has no cuMemcpyBatchAsync ({err})"
            return
        _fn = _SIGNATURE(int(ptr))


def unavailable_reason() -> str | None:
    """None where batched copies can be issued, else why not (one line)."""
    _resolve()
    return None if _fn is not None else _why


def copy_ranges_batch(src: np.ndarray, dst: np.ndarray, lens: np.ndarray, stream_handle: int) -> None:
    """Queue ``lens[i]`` bytes from address ``src[i]`` to ``dst[i]`` on the stream, one call."""
    _resolve()
    if _fn is None:
        raise BatchMemcpyError(f"cuMemcpyBatchAsync is unavailable: {_why}")
    n = len(src)
    if not n:
        return
    s = np.ascontiguousarray(src, dtype=np.uint64)
    d = np.ascontiguousarray(dst, dtype=np.uint64)
    sizes = np.ascontiguousarray(lens, dtype=np.uint64)
    attrs = _MemcpyAttributes(src_access_order=SRC_ACCESS_ORDER_STREAM)
    first = ctypes.c_size_t(0)
    fail = ctypes.c_size_t(0)
    err = _fn(d.ctypes.data, s.ctypes.data, sizes.ctypes.data, n, ctypes.addressof(attrs), ctypes.addressof(first), 1,
              ctypes.addressof(fail), stream_handle)
    if err:
        raise BatchMemcpyError(f"cuMemcpyBatchAsync returned CUresult {err} at copy {fail.value} of {n}")
