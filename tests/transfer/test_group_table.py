"""The compact group table the CUDA kernel expands: on the host, ``expand`` (the kernel's
arithmetic) must name exactly the rows and slices a row-by-row expansion of the groups names,
whatever the groups share. The kernel itself runs against a reference in tests/cuda."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload_ext.copies.group_table import FIELDS, expand, group_table


def reference(groups, slice_bytes):
    rows = []
    for src, dst, s_ids, d_ids in groups:
        width = src.shape[1]
        for i, j in zip(s_ids.tolist(), d_ids.tolist()):
            for lo in range(0, width, slice_bytes):
                rows.append((src.data_ptr() + i * src.stride(0) + lo, dst.data_ptr() + j * dst.stride(0) + lo,
                             min(slice_bytes, width - lo)))
    return rows


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_expand_names_every_row_slice_of_every_group(data):
    slice_bytes = data.draw(st.sampled_from([16, 48, 64]))
    base_s = torch.zeros(30, 200, dtype=torch.uint8)
    base_d = torch.zeros(20, 300, dtype=torch.uint8)
    shared_s = np.array(data.draw(st.lists(st.integers(0, 29), min_size=0, max_size=8)), dtype=np.int64)
    shared_d = np.array(data.draw(st.lists(st.integers(0, 19), min_size=len(shared_s), max_size=len(shared_s))),
                        dtype=np.int64)
    groups = []
    for _ in range(data.draw(st.integers(0, 6))):
        off = data.draw(st.integers(0, 100))
        width = data.draw(st.integers(1, 100))
        if data.draw(st.booleans()):
            s_ids, d_ids = shared_s, shared_d  # one id array for several groups (a job's layer views)
        else:
            k = data.draw(st.integers(0, 5))
            s_ids = np.array(data.draw(st.lists(st.integers(0, 29), min_size=k, max_size=k)), dtype=np.int64)
            d_ids = np.array(data.draw(st.lists(st.integers(0, 19), min_size=k, max_size=k)), dtype=np.int64)
        groups.append((base_s[:, off : off + width], base_d[:, off + 7 : off + 7 + width], s_ids, d_ids))
    table = group_table(groups, slice_bytes)
    assert list(zip(*(c.tolist() for c in expand(table)))) == reference(groups, slice_bytes)


def test_an_id_array_shared_by_every_layer_view_is_stored_once():
    layers = [torch.zeros(2, 16, 64, dtype=torch.uint8) for _ in range(4)]  # K and V rows of 4 layers
    host = torch.zeros(8, 4 * 2 * 64, dtype=torch.uint8)
    dev_ids, host_ids = np.array([3, 9, 1]), np.array([0, 5, 2])
    groups = [(layer[kv], host[:, (2 * i + kv) * 64 : (2 * i + kv + 1) * 64], dev_ids, host_ids)
              for i, layer in enumerate(layers) for kv in (0, 1)]
    table = group_table(groups, 1 << 16)
    g = len(groups)
    assert table.num_groups == 8 and table.num_items == 8 * 3
    assert len(table.data) == g + 1 + FIELDS * g + 2 * 3  # the two id arrays once, not once per group
    assert table.data[: g + 1].tolist() == [3 * i for i in range(g + 1)]


def test_empty_groups_are_left_out():
    a = torch.zeros(4, 32, dtype=torch.uint8)
    none = np.empty(0, dtype=np.int64)
    table = group_table([(a, a, none, none), (a[:, :0], a[:, :0], np.array([1]), np.array([2]))], 16)
    assert table.num_groups == 0 and table.num_items == 0
    assert all(len(c) == 0 for c in expand(table))
