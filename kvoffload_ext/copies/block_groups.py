"""``copy_block_groups``: several groups of row copies, checked, in one native call or one
kernel launch (the CPU loop over ``ranges``' byte ranges, or ``cuda_copy``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvoffload_ext.copies.cpu_copy import copy_ranges_cpu
from kvoffload_ext.copies.ranges import CopyGroup, as_ids, byte_ranges, check_group


def copy_block_groups(groups: Sequence[CopyGroup]) -> None:
    # Each id array copied once (``as_ids`` owns its result), kept shared by the groups that
    # shared it: the bounds below are memoized by identity.
    owned: dict[int, np.ndarray] = {}

    def own(ids: np.ndarray) -> np.ndarray:
        if id(ids) not in owned:
            owned[id(ids)] = as_ids(ids)
        return owned[id(ids)]

    groups = [(s, d, own(si), own(di)) for s, d, si, di in groups]
    bounds: dict[int, tuple[int, int]] = {}
    for group in groups:
        check_group(*group, bounds=bounds)
    copy_checked_groups(groups)


def copy_checked_groups(groups: Sequence[CopyGroup]) -> None:
    """The copy itself, for groups ``check_group`` has passed (their ids int64 arrays)."""
    groups = [g for g in groups if len(g[2])]
    if not groups:
        return
    cuda = {t.device for s, d, _, _ in groups for t in (s, d) if t.is_cuda}
    if len(cuda) > 1:
        raise ValueError(f"one copy spans several CUDA devices: {sorted(map(str, cuda))}")
    if cuda:
        from kvoffload_ext.copies.cuda_copy import copy_groups_cuda

        copy_groups_cuda(groups, cuda.pop())
    else:
        copy_ranges_cpu(*byte_ranges(groups, by_block=True))
