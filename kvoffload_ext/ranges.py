"""Block copies as byte ranges: every (row, row) pair of every group becomes (src, dst, length).

Turning all of a job's rows (every layer's K and V, every host chunk) into one address table
lets one native call or one kernel launch move them, instead of one call per layer view; and
rows that sit back to back on both sides fold into one longer range (cross-layer blocks in
consecutive slots, say).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

#: One copy group: rows ``src[src_ids[i]]`` go to ``dst[dst_ids[i]]``.
CopyGroup = tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]


def as_ids(ids: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        ids = ids.cpu().numpy()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def check_group(src: torch.Tensor, dst: torch.Tensor, src_ids: np.ndarray, dst_ids: np.ndarray) -> None:
    """Refuse anything whose rows would not be in bounds: the copies below use raw addresses."""
    if src.dim() != 2 or dst.dim() != 2:
        raise ValueError(f"copy_blocks needs 2-D tensors, got shapes {tuple(src.shape)} and {tuple(dst.shape)}")
    if src.dtype != torch.uint8 or dst.dtype != torch.uint8:
        raise ValueError(f"copy_blocks needs uint8 byte views, got {src.dtype} and {dst.dtype}")
    if src.shape[1] != dst.shape[1]:
        raise ValueError(f"row widths differ: src has {src.shape[1]} bytes, dst {dst.shape[1]}")
    if src.stride(1) != 1 or dst.stride(1) != 1:
        raise ValueError("each row must be contiguous (stride 1 along dim 1)")
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source ids but {len(dst_ids)} destination ids")
    for name, ids, rows in (("src", src_ids, src.shape[0]), ("dst", dst_ids, dst.shape[0])):
        if len(ids) and (ids.min() < 0 or ids.max() >= rows):
            bad = int(ids[(ids < 0) | (ids >= rows)][0])
            raise IndexError(f"{name} block id {bad} out of range [0, {rows})")


def byte_ranges(groups: Sequence[CopyGroup]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src addresses, dst addresses, lengths) of every row pair, groups in order, then folded."""
    srcs, dsts, lens = [], [], []
    for src, dst, s_ids, d_ids in groups:
        if not len(s_ids) or not src.shape[1]:
            continue
        srcs.append(src.data_ptr() + s_ids * src.stride(0))
        dsts.append(dst.data_ptr() + d_ids * dst.stride(0))
        lens.append(np.full(len(s_ids), src.shape[1], dtype=np.int64))
    if not srcs:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    return fold(np.concatenate(srcs), np.concatenate(dsts), np.concatenate(lens))


def fold(src: np.ndarray, dst: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge each range into the previous one when both sides continue exactly where it ended."""
    if len(src) < 2:
        return src, dst, lens
    joins = (src[1:] == src[:-1] + lens[:-1]) & (dst[1:] == dst[:-1] + lens[:-1])
    if not joins.any():
        return src, dst, lens
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    return src[starts], dst[starts], np.add.reduceat(lens, starts)
