"""Batched block copies behind one function.

``copy_blocks(src, dst, src_ids, dst_ids)`` copies row ``src[src_ids[i]]`` to
``dst[dst_ids[i]]`` for two 2-D uint8 tensors of equal row width (rows may be strided, each
row contiguous). It returns once the copy is issued: on CPU that means done; on CUDA it is
queued on the current stream. The implementation is picked from the tensors' devices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvoffload_ext.cpu_copy import copy_blocks_cpu

__all__ = ["copy_blocks", "copy_blocks_cpu"]


def _as_ids(ids: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        ids = ids.cpu().numpy()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def _check(src: torch.Tensor, dst: torch.Tensor, src_ids: np.ndarray, dst_ids: np.ndarray) -> None:
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


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: Sequence[int] | np.ndarray | torch.Tensor,
    dst_ids: Sequence[int] | np.ndarray | torch.Tensor,
) -> None:
    s_ids, d_ids = _as_ids(src_ids), _as_ids(dst_ids)
    _check(src, dst, s_ids, d_ids)
    if not len(s_ids):
        return
    if src.is_cuda or dst.is_cuda:
        from kvoffload_ext.cuda_copy import copy_blocks_cuda

        copy_blocks_cuda(src, dst, s_ids, d_ids)
    else:
        copy_blocks_cpu(src, dst, s_ids, d_ids)
