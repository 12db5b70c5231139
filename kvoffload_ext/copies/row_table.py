"""RowTable: the copy groups of a fixed set of tensor pairs, checked once, for jobs that differ
only in their row ids.

A KV store or load copies between the same device views and host columns every time; only the
block ids change. ``copy_block_groups`` checks every group and turns its rows into byte ranges
with a dozen small numpy calls per job: for the tiny model's jobs (a few KiB a layer) that was
~75 µs of host time each, several times the copy, and 5% of `kvoffload run`'s engine loop. A
table keeps the groups' addresses as one array; a job on the CPU is then one native call that
checks the ids' bounds and walks them (``kvo_copy_rows``). Jobs large enough to split across
copy threads, CUDA tensors, and machines without the native loop go the general way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvoffload_ext.copies.block_groups import copy_checked_groups
from kvoffload_ext.copies.cpu_copy import SPLIT_BYTES
from kvoffload_ext.copies.host_loop import native_lib
from kvoffload_ext.copies.ranges import CopyGroup, as_ids, check_ids, check_pair


class RowTable:
    """Copies row ``src_ids[i]`` of each pair's source to row ``dst_ids[i]`` of its destination,
    for every pair (2-D uint8 tensors of equal row width, rows contiguous), block by block."""

    __slots__ = ("_dst_rows", "_native", "_row_bytes", "_src_rows", "_table", "_table_ptr", "pairs")

    def __init__(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for s, d in pairs:
            check_pair(s, d)
        self.pairs = [(s, d) for s, d in pairs if s.shape[1]]  # rows of 0 bytes copy nothing
        self._table = np.array([(s.data_ptr(), s.stride(0), s.shape[0], d.data_ptr(), d.stride(0), d.shape[0],
                                 s.shape[1]) for s, d in self.pairs], dtype=np.int64).reshape(-1, 7)
        self._table_ptr = self._table.ctypes.data
        self._row_bytes = int(self._table[:, 6].sum())
        self._src_rows = int(self._table[:, 2].min(initial=np.iinfo(np.int64).max))
        self._dst_rows = int(self._table[:, 5].min(initial=np.iinfo(np.int64).max))
        on_cpu = all(not t.is_cuda for pair in self.pairs for t in pair)
        self._native = native_lib() if on_cpu and self.pairs else None

    def copy(self, src_ids: np.ndarray, dst_ids: np.ndarray) -> None:
        """Issue the job (on a CPU: done on return); ids out of any pair's bounds raise
        ``IndexError`` before anything is copied."""
        src_ids, dst_ids = as_ids(src_ids), as_ids(dst_ids)  # copies: checked and used as they are
        n = len(src_ids)
        if n != len(dst_ids):
            raise ValueError(f"{n} source ids but {len(dst_ids)} destination ids")
        if not n or not self.pairs:
            return
        if self._native is None or n * self._row_bytes >= 2 * SPLIT_BYTES:
            groups: list[CopyGroup] = [(s, d, src_ids, dst_ids) for s, d in self.pairs]
            bounds: dict[int, tuple[int, int]] = {}
            for group in groups:
                check_ids(*group, bounds=bounds)
            copy_checked_groups(groups)
            return
        bad = self._native.kvo_copy_rows(self._table_ptr, len(self._table), src_ids.ctypes.data,
                                         dst_ids.ctypes.data, n)
        if bad:
            i = bad - 1
            name, block, rows = (("src", src_ids[i], self._src_rows) if not 0 <= src_ids[i] < self._src_rows
                                 else ("dst", dst_ids[i], self._dst_rows))
            raise IndexError(f"{name} block id {int(block)} out of range [0, {rows})")
