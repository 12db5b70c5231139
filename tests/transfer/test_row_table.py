"""RowTable: a job's copies over pairs checked once. Each job must move exactly the bytes the
general path (``copy_block_groups``) moves, refuse out-of-bounds ids before touching anything,
and take the native walk for small CPU jobs (the point of it)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload_ext.copies import RowTable, block_groups, copy_block_groups, row_table
from kvoffload_ext.copies.host_loop import native_lib


@st.composite
def jobs(draw):
    """Pairs from a device-like set of per-view tensors into column slices of one host tensor
    (strided rows, as a host chunk's columns are), or the other way; ids with distinct targets."""
    widths = draw(st.lists(st.integers(0, 48), min_size=1, max_size=5))
    dev_rows, host_rows = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    devs = [torch.randint(0, 256, (dev_rows, w), dtype=torch.uint8, generator=gen) for w in widths]
    host = torch.randint(0, 256, (host_rows, sum(widths) + draw(st.integers(0, 8))), dtype=torch.uint8, generator=gen)
    offsets = np.cumsum([0, *widths[:-1]]).tolist()
    cols = [host[:, o : o + w] for o, w in zip(offsets, widths)]
    store = draw(st.booleans())
    pairs = list(zip(devs, cols)) if store else list(zip(cols, devs))
    src_rows, dst_rows = (dev_rows, host_rows) if store else (host_rows, dev_rows)
    n = draw(st.integers(0, min(src_rows, dst_rows)))
    dst_ids = np.array(draw(st.permutations(range(dst_rows)))[:n], dtype=np.int64)
    src_ids = np.array(draw(st.lists(st.integers(0, src_rows - 1), min_size=n, max_size=n)), dtype=np.int64)
    return devs, host, pairs, src_ids, dst_ids


def snapshot(devs, host):
    return [t.clone() for t in devs], host.clone()


@settings(max_examples=150, deadline=None)
@given(jobs())
def test_a_table_copies_what_the_general_path_copies(job):
    devs, host, pairs, src_ids, dst_ids = job
    before = snapshot(devs, host)
    copy_block_groups([(s, d, src_ids, dst_ids) for s, d in pairs])
    expected = snapshot(devs, host)
    for t, b in zip([*devs, host], [*before[0], before[1]]):
        t.copy_(b)
    RowTable(pairs).copy(src_ids, dst_ids)
    for t, e in zip([*devs, host], [*expected[0], expected[1]]):
        assert torch.equal(t, e)
    for s, d in pairs:  # and the general path was right: each target row holds its source row
        for i, j in zip(src_ids.tolist(), dst_ids.tolist()):
            assert torch.equal(d[j], s[i])


@settings(max_examples=60, deadline=None)
@given(jobs(), st.integers(0, 1), st.sampled_from([-1, 0]))
def test_ids_out_of_bounds_are_refused_before_anything_is_copied(job, side, how):
    devs, host, pairs, src_ids, dst_ids = job
    if not len(src_ids) or not any(s.shape[1] for s, _ in pairs):
        return
    ids = [src_ids.copy(), dst_ids.copy()]
    rows = min(p[side].shape[0] for p in pairs)
    ids[side][len(ids[side]) // 2] = how if how < 0 else rows  # one bad id, mid-job
    before = snapshot(devs, host)
    with pytest.raises(IndexError, match=f"{('src', 'dst')[side]} block id {ids[side][len(ids[side]) // 2]} out of range"):
        RowTable(pairs).copy(*ids)
    assert all(torch.equal(a, b) for a, b in zip([*devs, host], [*before[0], before[1]]))


def test_small_cpu_jobs_take_the_native_walk(monkeypatch):
    if native_lib() is None:
        pytest.skip("no C compiler: every job goes the general way")

    def general(_groups):
        raise AssertionError("a small CPU job went the general way")

    monkeypatch.setattr(row_table, "copy_checked_groups", general)
    src, dst = torch.randint(0, 256, (8, 64), dtype=torch.uint8), torch.zeros(8, 64, dtype=torch.uint8)
    RowTable([(src, dst)]).copy(np.array([5, 1]), np.array([0, 7]))
    assert torch.equal(dst[0], src[5]) and torch.equal(dst[7], src[1])


def test_jobs_large_enough_to_split_go_the_general_way_and_land(monkeypatch):
    """A job of two split parts or more is copied by several threads (the general path)."""
    calls = []
    original = block_groups.copy_checked_groups
    monkeypatch.setattr(row_table, "copy_checked_groups", lambda g: (calls.append(len(g)), original(g)))
    rows, width = 40, 256 << 10  # 10 MiB a job
    src = torch.randint(0, 256, (rows, width), dtype=torch.uint8)
    dst = torch.zeros(rows, width, dtype=torch.uint8)
    perm = np.random.default_rng(0).permutation(rows)
    RowTable([(src, dst)]).copy(np.arange(rows), perm)
    assert calls == [1]
    assert torch.equal(dst[torch.from_numpy(perm)], src)


def test_without_the_native_loop_a_table_still_copies(monkeypatch):
    src, dst = torch.randint(0, 256, (6, 24), dtype=torch.uint8), torch.zeros(6, 24, dtype=torch.uint8)
    table = RowTable([(src, dst)])
    table._native = None  # as on a machine without a C compiler
    table.copy(np.array([2, 3]), np.array([4, 0]))
    assert torch.equal(dst[4], src[2]) and torch.equal(dst[0], src[3])
    with pytest.raises(IndexError, match="dst block id 6 out of range"):
        table.copy(np.array([0]), np.array([6]))


def test_a_table_refuses_bad_pairs_when_built():
    with pytest.raises(ValueError, match="row widths differ"):
        RowTable([(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 9, dtype=torch.uint8))])
    with pytest.raises(ValueError, match="uint8"):
        RowTable([(torch.zeros(4, 8), torch.zeros(4, 8))])
    with pytest.raises(ValueError, match="2 source ids but 1"):
        RowTable([(torch.zeros(4, 8, dtype=torch.uint8),) * 2]).copy(np.array([0, 1]), np.array([0]))
