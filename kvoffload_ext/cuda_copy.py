"""CUDA block copies: one gather/scatter kernel launch for a job's small rows, copy engines for large ones.

Small rows (per-layer K/V of one block: 8-64 KiB) go through one CuPy RawKernel launch for
every range of the call: a small fixed grid striding over (range, 64 KiB slice) items, 16-byte
vector loads where source and destination share their alignment, four loads in flight per
thread (reads of pinned host memory cross PCIe and need many outstanding requests). Pinned
host memory is read or written directly through its device-mapped address (unified
addressing). The grid is small on purpose: measured on an H100, 32 blocks of 512 threads move
as much as a full grid, and the SMs they hold are all a compute kernel queued meanwhile waits
for. Rows of 256 KiB and more (cross-layer blocks) are one ``copy_`` each: the DMA engines
reach the same bandwidth there without taking any SM. Without CuPy every row is a ``copy_``
(the per-block loop vLLM's original ``swap_blocks`` used); that is logged once. Only imported
when CUDA is in use.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from kvoffload_ext.ranges import CopyGroup, byte_ranges

log = logging.getLogger("kvoffload")
# CuPy 14 deprecates ExternalStream for Stream.from_external; CuPy 13 has only the former.
warnings.filterwarnings("ignore", message="ExternalStream is deprecated", category=DeprecationWarning)

_KERNEL_SRC = r"""
extern "C" __global__ void copy_ranges(const long long* table, long long n, long long slice, long long per_range) {
    // Work item w is slice (w % per_range) of range (w / per_range); a capped grid strides over them.
    const long long step = blockDim.x;
    for (long long w = blockIdx.x; w < n * per_range; w += gridDim.x) {
        const long long r = w / per_range;
        const long long len = table[2 * n + r];
        const long long lo = (w % per_range) * slice;
        if (lo >= len) continue;
        const long long hi = lo + slice < len ? lo + slice : len;
        const unsigned char* s = (const unsigned char*)table[r];
        unsigned char* d = (unsigned char*)table[n + r];
        if ((((long long)s + lo) & 15) != (((long long)d + lo) & 15)) {
            for (long long i = lo + threadIdx.x; i < hi; i += step) d[i] = s[i];
            continue;
        }
        long long head = lo + ((16 - (((long long)s + lo) & 15)) & 15);
        if (head > hi) head = hi;
        for (long long i = lo + threadIdx.x; i < head; i += step) d[i] = s[i];
        const long long words = (hi - head) >> 4;
        const int4* s4 = reinterpret_cast<const int4*>(s + head);
        int4* d4 = reinterpret_cast<int4*>(d + head);
        long long i = threadIdx.x;
        for (; i + 3 * step < words; i += 4 * step) {
            int4 a = s4[i], b = s4[i + step], c = s4[i + 2 * step], e = s4[i + 3 * step];
            d4[i] = a; d4[i + step] = b; d4[i + 2 * step] = c; d4[i + 3 * step] = e;
        }
        for (; i < words; i += step) d4[i] = s4[i];
        for (long long j = head + (words << 4) + threadIdx.x; j < hi; j += step) d[j] = s[j];
    }
}
"""

#: Bytes one thread block copies at a time (a multiple of 16); larger ranges are split.
SLICE_BYTES = 64 << 10
THREADS = 512
#: Thread blocks of one launch: enough loads in flight to fill PCIe, few SMs held.
GRID_BLOCKS = 32
#: Rows at least this wide are copied by the DMA engines (one ``copy_`` each), not the kernel.
DMA_MIN_BYTES = 256 << 10
_kernel = None
_warned = False


def _get_kernel():
    global _kernel
    if _kernel is None:
        import cupy

        _kernel = cupy.RawKernel(_KERNEL_SRC, "copy_ranges")
    return _kernel


def cupy_available() -> bool:
    return importlib.util.find_spec("cupy") is not None


def check_device_addressable(t: torch.Tensor) -> None:
    """Device memory, or pinned host memory (mapped into the device's address space)."""
    if not t.is_cuda and not t.is_pinned():
        raise ValueError("host side of a CUDA block copy must be pinned memory (HostBlockBuffer(pin=True))")


def copy_ranges_cuda(src: np.ndarray, dst: np.ndarray, lens: np.ndarray, device: torch.device) -> None:
    """Launch one kernel on the current stream that copies every range (addresses device-usable)."""
    import cupy

    n = len(lens)
    if not n:
        return
    per_range = -(-int(lens.max()) // SLICE_BYTES)
    blocks = min(n * per_range, GRID_BLOCKS)
    stream = torch.cuda.current_stream(device)
    host_table = torch.from_numpy(np.concatenate([src, dst, lens]).astype(np.int64)).pin_memory()
    table = host_table.to(device, non_blocking=True)  # the pinned table stays alive until its copy ran
    with cupy.cuda.Device(device.index or 0), cupy.cuda.ExternalStream(stream.cuda_stream, device.index or 0):
        _get_kernel()((blocks,), (THREADS,),
                      (table.data_ptr(), np.int64(n), np.int64(SLICE_BYTES), np.int64(per_range)))
    table.record_stream(stream)


def copy_groups_cuda(groups: Sequence[CopyGroup], device: torch.device) -> None:
    for src, dst, _, _ in groups:
        check_device_addressable(src)
        check_device_addressable(dst)
    small = [g for g in groups if g[0].shape[1] < DMA_MIN_BYTES]
    if small and cupy_available():
        copy_ranges_cuda(*byte_ranges(small), device)
    elif small:
        global _warned
        if not _warned:
            _warned = True
            log.warning("CuPy is not installed: CUDA block copies of rows under %d KiB fall back to one copy per "
                        "row (slow); pip install 'kvoffload[cuda]'", DMA_MIN_BYTES >> 10)
        for group in small:
            copy_blocks_loop(*group)
    for group in groups:
        if group[0].shape[1] >= DMA_MIN_BYTES:
            copy_blocks_loop(*group)


def copy_blocks_loop(src: torch.Tensor, dst: torch.Tensor, src_ids: np.ndarray, dst_ids: np.ndarray) -> None:
    """Per-row async copies: the fallback and the benchmark baseline."""
    for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
        dst[d].copy_(src[s], non_blocking=True)
