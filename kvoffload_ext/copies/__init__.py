"""Batched block copies behind two functions (re-exported as ``kvoffload_ext.copy_blocks`` and
``kvoffload_ext.copy_block_groups``).

``copy_blocks(src, dst, src_ids, dst_ids)`` copies row ``src[src_ids[i]]`` to
``dst[dst_ids[i]]`` for two 2-D uint8 tensors of equal row width (rows may be strided, each
row contiguous). ``copy_block_groups`` does the same for several such groups at once (every
layer view of a KV cache, say) in one native call or one kernel launch. Both return once the
copy is issued: on CPU that means done; on CUDA it is queued on the current stream. The
implementation is picked from the tensors' devices: ``cpu_copy`` (over ``host_loop``),
``cuda_copy`` (over ``group_table``), both from the byte ranges ``ranges`` computes.
``RowTable`` holds a fixed set of groups, checked once, for jobs that differ only in their ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from kvoffload_ext.copies.block_groups import copy_block_groups
from kvoffload_ext.copies.host_loop import native_lib
from kvoffload_ext.copies.ranges import CopyGroup, as_ids
from kvoffload_ext.copies.row_table import RowTable

__all__ = ["CopyGroup", "RowTable", "copy_block_groups", "copy_blocks", "prepare_copies"]


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: Sequence[int] | np.ndarray | torch.Tensor,
    dst_ids: Sequence[int] | np.ndarray | torch.Tensor,
) -> None:
    copy_block_groups([(src, dst, as_ids(src_ids), as_ids(dst_ids))])


def prepare_copies(device: torch.device, widths: Iterable[int]) -> None:
    """Settle how rows of these widths are copied on ``device`` now, so that no job pays for it:
    the host copy loop is built (on a fresh machine it is compiled, 0.8 s, which stalled the
    first store and let a tiny tier fill with blocks still in flight, dropping the stores after
    it), and a CUDA device's choice of copy method is measured once per width class and logged."""
    native_lib()
    if device.type == "cuda":
        from kvoffload_ext.copies.cuda_copy import methods_for

        methods_for(device).prepare(widths)
