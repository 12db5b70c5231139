"""kvoffload's native code, three concerns, each in its own modules:

- **Block copies** (this module's ``copy_blocks`` and ``copy_block_groups``; ``cpu_copy``,
  ``cuda_copy``, ``ranges``, ``group_table``, ``native``): ``copy_blocks(src, dst, src_ids,
  dst_ids)`` copies row ``src[src_ids[i]]`` to ``dst[dst_ids[i]]`` for two 2-D uint8 tensors of
  equal row width (rows may be strided, each row contiguous); ``copy_block_groups`` does the
  same for several such groups at once (every layer view of a KV cache, say) in one native call
  or one kernel launch. Both return once the copy is issued: on CPU that means done; on CUDA it
  is queued on the current stream. The implementation is picked from the tensors' devices.
- **The block ledger in C** (``_ledger``, from ``_ledger.c`` and the ``ledger_*.h`` headers,
  built by ``pip install``; optional): the host and disk tiers' slot bookkeeping and the
  LRU / ARC / prefix-value orders (``kvoffload.offload.native_ledger`` binds it).
- **The fs tier's record files** (``fs_files``, from ``fs_files.c``, compiled on first use):
  one call writes a bucket's records or reads a batch, with the GIL released.

Nothing here decides policy or knows a tier's layout beyond the bytes it is handed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvoffload_ext.cpu_copy import copy_ranges_cpu
from kvoffload_ext.ranges import CopyGroup, as_ids, byte_ranges, check_group

__all__ = ["CopyGroup", "copy_block_groups", "copy_blocks"]


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: Sequence[int] | np.ndarray | torch.Tensor,
    dst_ids: Sequence[int] | np.ndarray | torch.Tensor,
) -> None:
    copy_block_groups([(src, dst, as_ids(src_ids), as_ids(dst_ids))])


def copy_block_groups(groups: Sequence[CopyGroup]) -> None:
    groups = [(s, d, as_ids(si), as_ids(di)) for s, d, si, di in groups]
    bounds: dict[int, tuple[int, int]] = {}
    for group in groups:
        check_group(*group, bounds=bounds)
    groups = [g for g in groups if len(g[2])]
    if not groups:
        return
    cuda = {t.device for s, d, _, _ in groups for t in (s, d) if t.is_cuda}
    if len(cuda) > 1:
        raise ValueError(f"one copy spans several CUDA devices: {sorted(map(str, cuda))}")
    if cuda:
        from kvoffload_ext.cuda_copy import copy_groups_cuda

        copy_groups_cuda(groups, cuda.pop())
    else:
        copy_ranges_cpu(*byte_ranges(groups))
