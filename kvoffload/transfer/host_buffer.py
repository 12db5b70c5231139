"""Host memory for offloaded blocks, allocated in chunks.

Pinning one huge buffer can take seconds and fail outright; chunks of a few hundred MiB pin
quickly and let the tier start before all of it is touched. A row holds one engine block's
page; an offloaded block is ``block_size_factor`` consecutive rows.

Unpinned chunks are faulted in when the tier is built (``MADV_POPULATE_WRITE``), as pinning
does for pinned ones: a server that reports ready then serves at full speed. Left to the first
copies, the kernel's page zeroing cost 25x the copy itself: measured in a vLLM CPU server, 5.4%
of the worker's CPU time went to ``clear_page`` in the store threads, on the core the model
computes on, 0.2% to the memmove. Done on a thread beside a serving engine instead, it took the
same core for seconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import time
from collections.abc import Iterator

import numpy as np
import torch

from kvoffload.config.values import format_bytes
from kvoffload.errors import ConfigError
from kvoffload.host_memory import available_memory_bytes

DEFAULT_CHUNK_BYTES = 256 << 20
#: Linux >= 5.14: populate (fault in, writable) without touching the contents.
MADV_POPULATE_WRITE = 23
#: Buffers smaller than this are left to fault in on first use (tests, tiny tiers).
PREFAULT_MIN_BYTES = 64 << 20
#: Pages populated per call: the kernel holds the address-space lock for a call, and a long
#: hold would stall other threads' ``munmap`` (vLLM's workers start several engines' threads).
PREFAULT_STEP_BYTES = 4 << 20

logger = logging.getLogger(__name__)


class HostBlockBuffer:
    def __init__(self, num_rows: int, row_bytes: int, pin: bool = False, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 row_multiple: int = 1) -> None:
        if num_rows < 1 or row_bytes < 1:
            raise ValueError(f"host buffer of {num_rows} rows x {row_bytes} bytes: both must be >= 1")
        self.num_rows = num_rows
        self.row_bytes = row_bytes
        free = available_memory_bytes()
        if free is not None and self.nbytes > free:
            raise ConfigError(f"the CPU tier's {format_bytes(self.nbytes)} is more than the {format_bytes(free)} of host "
                              "memory available now (beside the engine's own KV cache and weights): lower the tier's "
                              "capacity, or the engine's share (vLLM: --gpu-memory-utilization)")
        # An offloaded block's rows (row_multiple of them) never straddle two chunks.
        per_chunk = max(1, chunk_bytes // row_bytes)
        self.rows_per_chunk = max(row_multiple, per_chunk - per_chunk % row_multiple)
        self.chunks: list[torch.Tensor] = []
        remaining = num_rows
        while remaining:
            n = min(remaining, self.rows_per_chunk)
            self.chunks.append(torch.empty((n, row_bytes), dtype=torch.uint8, pin_memory=pin))
            remaining -= n
        self._columns: dict[tuple[int, int, int], torch.Tensor] = {}
        #: Bytes faulted in at construction (0: small, pinned, or a kernel without the call).
        self.prefaulted = 0
        if not pin and self.nbytes >= PREFAULT_MIN_BYTES:
            t0 = time.perf_counter()
            self.prefaulted = prefault(self.chunks)
            logger.debug("host buffer: %d MiB faulted in in %.2f s", self.prefaulted >> 20, time.perf_counter() - t0)

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.row_bytes

    def group(self, rows: np.ndarray, others: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Split (host row, other id) pairs by chunk: (chunk index, local rows, other ids)."""
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"host row out of range [0, {self.num_rows})")
        if len(self.chunks) == 1:
            yield 0, rows, others
            return
        chunk_of = rows // self.rows_per_chunk
        for c in np.unique(chunk_of):
            sel = chunk_of == c
            yield int(c), rows[sel] - int(c) * self.rows_per_chunk, others[sel]

    def columns(self, chunk: int, offset: int, width: int) -> torch.Tensor:
        """Bytes ``[offset, offset + width)`` of every row of one chunk, as a 2-D view (one per
        layer view of a KV page; cached: a job asks for every one of them)."""
        key = (chunk, offset, width)
        view = self._columns.get(key)
        if view is None:
            view = self._columns[key] = self.chunks[chunk][:, offset : offset + width]
        return view

    def rows(self, first: int, count: int) -> torch.Tensor:
        """``count`` consecutive rows inside one chunk, as a 2-D view."""
        c, local = divmod(first, self.rows_per_chunk)
        if local + count > self.rows_per_chunk:
            raise IndexError(f"rows {first}..{first + count - 1} straddle a chunk boundary")
        return self.chunks[c][local : local + count]

    def row(self, r: int) -> torch.Tensor:
        return self.chunks[r // self.rows_per_chunk][r % self.rows_per_chunk]


def prefault(chunks: list[torch.Tensor]) -> int:
    """Fault every whole page of ``chunks`` in; returns the bytes populated (0 where the kernel
    or libc lacks ``MADV_POPULATE_WRITE``: the pages then fault in on first use). Contents
    are left as they are."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return 0
    madvise = ctypes.CDLL(libc_name, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = mmap.PAGESIZE
    done = 0
    for chunk in chunks:
        start = -(-chunk.data_ptr() // page) * page  # madvise needs a page-aligned start
        end = (chunk.data_ptr() + chunk.numel()) // page * page
        if end <= start:
            continue
        for lo in range(start, end, PREFAULT_STEP_BYTES):
            n = min(PREFAULT_STEP_BYTES, end - lo)
            if madvise(lo, n, MADV_POPULATE_WRITE) != 0:
                return done
            done += n
    return done
