"""CUDA block copies: one gather/scatter kernel launch for a job's small rows, copy engines for large ones.

Small rows (per-layer K/V of one block: 8-64 KiB) go through one CuPy RawKernel launch for
every row of the call: a small fixed grid striding over (row, 64 KiB slice) items, 16-byte
vector loads where source and destination share their alignment, four loads in flight per
thread (reads of pinned host memory cross PCIe and need many outstanding requests). The
kernel reads the job as a compact group table (``group_table``: where each layer view's
rows start, their stride, the block ids once) and computes every row's address itself, so
the host's work per call does not grow with layers x blocks. Pinned
host memory is read or written directly through its device-mapped address (unified
addressing). The grid is small on purpose: measured on an H100, 32 blocks of 512 threads move
as much as a full grid, and the SMs they hold are all a compute kernel queued meanwhile waits
for. For rows of 256 KiB and more (cross-layer blocks) the DMA engines reached the same
bandwidth there without taking any SM. Which of the kernel, one
``cuMemcpyBatchAsync`` call (``batch_memcpy``) or a ``copy_`` per row moves a width fastest is
measured per device (``copy_methods``, ``methods_for``); without CuPy or the batch call every row is a ``copy_``
(the per-block loop vLLM's original ``swap_blocks`` used), logged once. Only imported when
CUDA is in use.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Sequence

import numpy as np
import torch

from kvoffload_ext.copies.batch_memcpy import copy_ranges_batch, unavailable_reason
from kvoffload_ext.copies.copy_methods import BATCH, COPY, D2H, H2D, KERNEL, CopyMethods
from kvoffload_ext.copies.group_table import GroupTable, group_table
from kvoffload_ext.copies.ranges import CopyGroup, byte_ranges

log = logging.getLogger("kvoffload")

_KERNEL_SRC = r"""
__device__ void copy_slice(const unsigned char* s, unsigned char* d, long long lo, long long hi) {
    // Bytes [lo, hi) of one row, by the whole thread block: int4 words where both sides share
    // their alignment, four loads in flight per thread; bytes elsewhere.
    const long long step = blockDim.x;
    if ((((long long)s + lo) & 15) != (((long long)d + lo) & 15)) {
        for (long long i = lo + threadIdx.x; i < hi; i += step) d[i] = s[i];
        return;
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

extern "C" __global__ void copy_groups(const long long* t, long long groups, long long slice) {
    // t: the group table (kvoffload_ext/group_table.py). A capped grid strides over work items
    // (one slice of one row); an item's group is the last whose first item is <= it.
    const long long items = t[groups];
    for (long long w = blockIdx.x; w < items; w += gridDim.x) {
        long long lo = 0, hi = groups - 1;
        while (lo < hi) {
            const long long mid = (lo + hi + 1) >> 1;
            if (t[mid] <= w) lo = mid; else hi = mid - 1;
        }
        const long long* g = t + groups + 1 + 8 * lo;
        const long long local = w - t[lo];
        const long long row = local / g[7];
        const long long first = (local - row * g[7]) * slice;
        const long long last = first + slice < g[4] ? first + slice : g[4];
        const unsigned char* s = (const unsigned char*)(g[0] + t[g[5] + row] * g[1]);
        unsigned char* d = (unsigned char*)(g[2] + t[g[6] + row] * g[3]);
        copy_slice(s, d, first, last);
    }
}
"""

#: Bytes one thread block copies at a time (a multiple of 16); larger rows are split.
SLICE_BYTES = 64 << 10
THREADS = 512
#: Thread blocks of one launch: enough loads in flight to fill PCIe, few SMs held.
GRID_BLOCKS = 32
#: Bytes a probe job moves per method and repetition (rows of the probed width).
PROBE_BYTES = 16 << 20
#: Where no method could be measured, rows this wide and wider go to the copy engines.
UNMEASURED_DMA_BYTES = 256 << 10
_kernel = None


def _get_kernel():
    global _kernel
    if _kernel is None:
        import cupy

        _kernel = cupy.RawKernel(_KERNEL_SRC, "copy_groups")
    return _kernel


def cupy_available() -> bool:
    return importlib.util.find_spec("cupy") is not None


def check_device_addressable(t: torch.Tensor) -> None:
    """Device memory, or pinned host memory (mapped into the device's address space)."""
    if not t.is_cuda and not t.is_pinned():
        raise ValueError("host side of a CUDA block copy must be pinned memory (HostBlockBuffer(pin=True))")


class _TableStaging:
    """Pinned host memory for one device's kernel tables, reused across calls (pinning a
    fresh one per call costs a page-locking allocation each time). A buffer is reused only
    once the event recorded behind its last upload has passed; the host never waits for one
    (an upload can sit behind a store that waits for the compute stream): while every pooled
    buffer is busy, a new one is pinned."""

    #: Buffers kept per device; past this, a busy pool pins a one-off buffer per call.
    MAX_POOLED = 8

    def __init__(self) -> None:
        self._pool: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []
        self._lock = threading.Lock()

    def upload(self, table: np.ndarray, device: torch.device, stream: torch.cuda.Stream) -> torch.Tensor:
        """``table`` (int64) in device memory, its upload queued on ``stream``."""
        n = len(table)
        with self._lock:
            slot = next((i for i, (_, ev) in enumerate(self._pool) if ev is None or ev.query()), None)
            if slot is None and len(self._pool) < self.MAX_POOLED:
                self._pool.append((torch.empty(0, dtype=torch.int64), None))
                slot = len(self._pool) - 1
            buf = self._pool[slot][0] if slot is not None else torch.empty(0, dtype=torch.int64)
            if buf.numel() < n:
                buf = torch.empty(max(n, 2 * buf.numel(), 1 << 12), dtype=torch.int64, pin_memory=True)
            buf.numpy()[:n] = table
            with torch.cuda.stream(stream):
                on_device = buf[:n].to(device, non_blocking=True)
            if slot is not None:
                event = torch.cuda.Event()
                event.record(stream)
                self._pool[slot] = (buf, event)
        return on_device


_staging: dict[int, _TableStaging] = {}
_staging_lock = threading.Lock()


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _table_staging(device: torch.device) -> _TableStaging:
    index = _device_index(device)
    with _staging_lock:
        return _staging.setdefault(index, _TableStaging())


def copy_table_cuda(table: GroupTable, device: torch.device) -> None:
    """Launch one kernel on the current stream that copies every row of ``table``'s groups."""
    if not table.num_items:
        return
    stream = torch.cuda.current_stream(device)
    on_device = _table_staging(device).upload(table.data, device, stream)
    index = _device_index(device)
    import cupy

    with cupy.cuda.Device(index), cupy_stream(stream.cuda_stream, index):
        _get_kernel()((min(table.num_items, GRID_BLOCKS),), (THREADS,),
                      (on_device.data_ptr(), np.int64(table.num_groups), np.int64(table.slice_bytes)))
    on_device.record_stream(stream)


_streams: dict[tuple[int, int], object] = {}


def cupy_stream(ptr: int, device_index: int):  # -> cupy.cuda.Stream (untyped: CuPy is optional)
    """torch's stream as a CuPy stream, kept per handle (a wrapper per launch was host time).
    ``Stream.from_external`` where CuPy has it (14: ``ExternalStream`` is deprecated there and
    warns on every construction), ``ExternalStream`` on CuPy 13."""
    key = (ptr, device_index)
    wrapped = _streams.get(key)
    if wrapped is None:
        import cupy

        if hasattr(cupy.cuda.Stream, "from_external"):
            try:
                wrapped = cupy.cuda.Stream.from_external(ptr, device_index)
            except TypeError:  # a release whose from_external takes the handle alone
                wrapped = cupy.cuda.Stream.from_external(ptr)
        else:
            wrapped = cupy.cuda.ExternalStream(ptr, device_index)
        _streams[key] = wrapped
    return wrapped


def _direction(src: torch.Tensor, dst: torch.Tensor) -> str | None:
    if src.is_cuda and not dst.is_cuda:
        return D2H
    if dst.is_cuda and not src.is_cuda:
        return H2D
    return None  # device to device: the kernel (or a copy_ without CuPy)


def copy_groups_cuda(groups: Sequence[CopyGroup], device: torch.device) -> None:
    for src, dst, _, _ in groups:
        check_device_addressable(src)
        check_device_addressable(dst)
    chosen = methods_for(device)
    kernel = cupy_available()
    by_method: dict[str, list[CopyGroup]] = {KERNEL: [], BATCH: [], COPY: []}
    for group in groups:
        direction = _direction(group[0], group[1])
        method = (KERNEL if kernel else COPY) if direction is None else chosen.method(group[0].shape[1], direction)
        by_method[method].append(group)
    if by_method[KERNEL]:
        copy_table_cuda(group_table(by_method[KERNEL], SLICE_BYTES), device)
    if by_method[BATCH]:
        handle = torch.cuda.current_stream(device).cuda_stream
        if handle:
            copy_ranges_batch(*byte_ranges(by_method[BATCH]), handle)
        else:  # the legacy default stream, which cuMemcpyBatchAsync refuses
            by_method[COPY] += by_method[BATCH]
    for group in by_method[COPY]:
        copy_blocks_loop(*group)


def copy_blocks_loop(src: torch.Tensor, dst: torch.Tensor, src_ids: np.ndarray, dst_ids: np.ndarray) -> None:
    """Per-row async copies: the fallback and the benchmark baseline."""
    for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
        dst[d].copy_(src[s], non_blocking=True)


_methods: dict[int, CopyMethods] = {}
_methods_lock = threading.Lock()


def methods_for(device: torch.device) -> CopyMethods:
    """The device's choice of copy method per row width (one per device and process), among the
    methods available here."""
    index = _device_index(device)
    with _methods_lock:
        chosen = _methods.get(index)
        if chosen is None:
            methods = [m for m, ok in ((KERNEL, cupy_available()), (BATCH, unavailable_reason() is None),
                                       (COPY, True)) if ok]
            if methods == [COPY]:
                log.warning("neither CuPy nor cuMemcpyBatchAsync (%s) is available: CUDA block copies issue one "
                            "copy per row (slow for per-layer KV); pip install 'kvoffload[cuda]'", unavailable_reason())
            name = f"cuda:{index} ({torch.cuda.get_device_name(index)})"
            dev = torch.device("cuda", index)
            chosen = _methods[index] = CopyMethods(name, lambda m, w, d: _probe(dev, m, w, d), methods, _unmeasured)
        return chosen


def _unmeasured(row_bytes: int) -> str:
    """Where no probe ran: the kernel for rows under 256 KiB (where CuPy is), copies above."""
    return KERNEL if cupy_available() and row_bytes < UNMEASURED_DMA_BYTES else COPY


def _probe(device: torch.device, method: str, row_bytes: int, direction: str) -> float | None:
    """GB/s of ``method`` moving rows of ``row_bytes`` between scattered device rows and pinned
    host rows, host issue time included (the per-row loop's cost is its calls), best of three."""
    rows = max(8, min(4096, PROBE_BYTES // row_bytes))
    gen = torch.Generator().manual_seed(0)
    try:
        dev = torch.empty((2 * rows, row_bytes), dtype=torch.uint8, device=device)
        host = torch.empty((rows, row_bytes), dtype=torch.uint8, pin_memory=True)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:  # a device the engine filled already
        log.info("copy methods: no room for a %d MiB probe (%s); %s not measured", 3 * rows * row_bytes >> 20, exc,
                 method)
        return None
    dev_ids = torch.randperm(2 * rows, generator=gen)[:rows].numpy()
    host_ids = torch.randperm(rows, generator=gen).numpy()
    group = (dev, host, dev_ids, host_ids) if direction == D2H else (host, dev, host_ids, dev_ids)
    stream = torch.cuda.Stream(device)

    def run() -> None:
        if method == KERNEL:
            copy_table_cuda(group_table([group], SLICE_BYTES), device)
        elif method == BATCH:
            copy_ranges_batch(*byte_ranges([group]), stream.cuda_stream)
        else:
            copy_blocks_loop(*group)

    best = float("inf")
    with torch.cuda.stream(stream):
        try:
            run()  # compiles the kernel, touches every page
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - a method this driver or build cannot run: not a choice
            log.info("copy methods: %s on %s rows failed (%s); not used", method, row_bytes, exc)
            return None
        for _ in range(3):
            start = time.perf_counter()
            run()
            stream.synchronize()
            best = min(best, time.perf_counter() - start)
    return rows * row_bytes / best / 1e9
