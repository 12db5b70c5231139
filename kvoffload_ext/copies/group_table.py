"""A job's copy groups as one small int64 table that the CUDA kernel expands on the device.

A job of per-layer KV has one group per (layer view, host chunk), all sharing one or two id
arrays: expanding it on the host into a (src, dst, length) row per copied row (3 x 8 bytes x
layers x 2 x blocks) cost more host time than the copy took on an H100 (a 1 GiB job of 8 KiB
rows: ~12 ms of numpy and pinning before a 21 ms kernel). The table instead holds, per
group, where its rows start and how far apart they are, and each distinct id array once; the
kernel finds a work item's group by binary search over the groups' first items and computes
the addresses itself. ``expand`` is the same arithmetic on the host, for tests.

Layout (all int64), G groups:
  [0, G]             first work item of each group; [G] = all items
  G+1 + 8*g ...      group g: src base, src stride, dst base, dst stride, row bytes,
                     index of its first src id in this table, of its first dst id, slices per row
  then               the distinct id arrays, back to back
A work item is one slice (``slice_bytes``) of one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvoffload_ext.copies.ranges import CopyGroup, live_groups

#: int64 fields per group record.
FIELDS = 8


@dataclass(frozen=True, slots=True)
class GroupTable:
    data: np.ndarray
    num_groups: int
    slice_bytes: int

    @property
    def num_items(self) -> int:
        return int(self.data[self.num_groups])


def group_table(groups: Sequence[CopyGroup], slice_bytes: int) -> GroupTable:
    """The table of ``groups`` (empty ones left out); an id array shared by several groups (the
    same object: the caller keeps them all alive) is stored once."""
    live = live_groups(groups)
    n = len(live)
    head = n + 1 + FIELDS * n
    id_arrays: list[np.ndarray] = []
    where: dict[int, int] = {}
    at = head

    def place(ids: np.ndarray) -> int:
        nonlocal at
        found = where.get(id(ids))
        if found is None:
            found = where[id(ids)] = at
            id_arrays.append(ids)
            at += len(ids)
        return found

    records, items = [], []
    for src, dst, s_ids, d_ids in live:
        width = src.shape[1]
        per_row = -(-width // slice_bytes)
        records.append((src.data_ptr(), src.stride(0), dst.data_ptr(), dst.stride(0), width, place(s_ids),
                        place(d_ids), per_row))
        items.append(len(s_ids) * per_row)
    data = np.empty(at, dtype=np.int64)
    data[0] = 0
    if n:
        np.cumsum(items, out=data[1 : n + 1])
        data[n + 1 : head] = np.array(records, dtype=np.int64).reshape(-1)
    pos = head
    for ids in id_arrays:
        data[pos : pos + len(ids)] = ids
        pos += len(ids)
    return GroupTable(data, n, slice_bytes)


def expand(table: GroupTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src address, dst address, bytes) of every work item, in item order: what the kernel
    copies, computed the way it does (binary search for the group, then the row's addresses)."""
    t, n, sl = table.data, table.num_groups, table.slice_bytes
    out = []
    for w in range(table.num_items):
        g = int(np.searchsorted(t[: n + 1], w, side="right")) - 1
        s_base, s_stride, d_base, d_stride, width, s_at, d_at, per_row = t[n + 1 + FIELDS * g : n + 1 + FIELDS * (g + 1)]
        local = w - int(t[g])
        row, part = divmod(local, int(per_row))
        lo = part * sl
        hi = min(lo + sl, int(width))
        out.append((int(s_base + t[s_at + row] * s_stride + lo), int(d_base + t[d_at + row] * d_stride + lo), hi - lo))
    if not out:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    cols = np.array(out, dtype=np.int64)
    return cols[:, 0], cols[:, 1], cols[:, 2]
