"""The host-copy C boundary against hostile callers (round 7): a thread rewriting the ids while
the copy runs with the GIL released, destinations whose rows overlap, alias, sit on a device
with no memory or reach past their storage, ids that are floats or booleans. Each is refused
with a ValueError naming the tensor or the ids before any byte moves, or copied exactly; never
a crash, never a row written that the job did not name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload_ext.copies import RowTable, copy_block_groups, copy_blocks

ROOT = Path(__file__).parents[2]


def test_a_thread_rewriting_the_ids_mid_copy_cannot_crash_the_process():
    """``kvo_copy_rows`` read the caller's id array again after checking it, with the GIL
    released: a thread flipping ``dst_ids[-1]`` to 2**40 killed the process (SIGSEGV) within
    8 s. The ids are now copied into memory the call owns before they are checked."""
    code = """
import threading, time
import numpy as np, torch
from kvoffload_ext.copies import RowTable
from kvoffload_ext.copies.host_loop import native_lib
assert native_lib() is not None
n = 1 << 20
src = torch.zeros(n, 1, dtype=torch.uint8)
dst = torch.zeros(n, 1, dtype=torch.uint8)
table = RowTable([(src, dst)])
src_ids = np.arange(n, dtype=np.int64)
dst_ids = np.arange(n, dtype=np.int64)
stop = time.monotonic() + 3.0
def flip():
    while time.monotonic() < stop:
        dst_ids[-1] = 2 ** 40
        dst_ids[-1] = n - 1
t = threading.Thread(target=flip)
t.start()
copies = refused = 0
while time.monotonic() < stop:
    try:
        table.copy(src_ids, dst_ids)
        copies += 1
    except IndexError:
        refused += 1
t.join()
print(copies, refused)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    copies, refused = map(int, done.stdout.split())
    assert copies + refused > 0


def rows(n: int = 4, width: int = 16) -> torch.Tensor:
    return torch.arange(n * width, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(n, width)


BASE = torch.zeros(64, dtype=torch.uint8)


@pytest.mark.parametrize("dst, words", [
    (BASE.as_strided((4, 16), (4, 1)), "the dst tensor's rows overlap (row stride 4 < row width 16"),
    (torch.zeros(1, 16, dtype=torch.uint8).expand(4, 16), "the dst tensor's rows overlap (row stride 0"),
    (torch.zeros(64, dtype=torch.uint8), "copy_blocks needs 2-D tensors, got shapes (4, 16) and (64,)"),
])
def test_destinations_a_raw_copy_cannot_write_safely_are_refused(dst, words):
    """Overlapping (as_strided) or aliased (expand) rows were accepted: block 1 overwrote block
    0's tail; a 1-D one was an IndexError."""
    before = BASE.clone()
    for copy in (lambda: RowTable([(rows(), dst)]).copy(np.array([0, 1]), np.array([0, 1])),
                 lambda: copy_block_groups([(rows(), dst, np.array([0, 1]), np.array([0, 1]))])):
        with pytest.raises(ValueError) as exc:
            copy()
        assert words in str(exc.value)
    assert torch.equal(BASE, before)


@pytest.mark.parametrize("make, words", [
    ('torch.empty(4, 16, dtype=torch.uint8, device="meta")', "the dst tensor is on device meta, which holds no memory"),
    ("torch.zeros(64, dtype=torch.uint8).view(4, 16); dst.untyped_storage().resize_(16)",
     "the dst tensor's rows reach byte 64 of a storage of 16"),
])
def test_destinations_without_memory_behind_them_are_refused_in_a_child_that_survives(make, words):
    """A meta tensor's address is 0: the copy was a SIGSEGV; a view whose storage was shrunk
    after it was taken was written past its allocation (each run in a child process, so a
    regression kills the child, not the suite)."""
    code = f"""
import numpy as np, torch
from kvoffload_ext.copies import RowTable, copy_block_groups
src = torch.zeros(4, 16, dtype=torch.uint8)
dst = {make}
for copy in (lambda: RowTable([(src, dst)]).copy(np.array([0]), np.array([0])),
             lambda: copy_block_groups([(src, dst, np.array([0]), np.array([0]))])):
    try:
        copy()
    except ValueError as exc:
        print(exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    assert done.stdout.count(words) == 2, done.stdout


@pytest.mark.parametrize("ids, words", [
    (np.array([1.7, 0.0]), "block ids must be integers in int64's range, got float64 ids (e.g. 1.7)"),
    (np.array([True, False]), "got bool ids"),
    ([1.7, 0], "got float64 ids"),
    (torch.tensor([1.0, 0.0]), "got float32 ids"),
    ([2 ** 64, 0], "block ids must be integers"),
    (np.array([2 ** 64 - 1], dtype=np.uint64), "out of any tensor's range"),
])
def test_ids_that_are_not_integers_are_refused_not_truncated(ids, words):
    """Float ids were truncated (1.7 -> row 1) and booleans taken as 0 and 1."""
    dst = torch.zeros(4, 16, dtype=torch.uint8)
    for copy in (lambda: RowTable([(rows(), dst)]).copy(np.array([0, 1]), ids),
                 lambda: copy_blocks(rows(), dst, [0, 1], ids)):
        with pytest.raises((ValueError, IndexError)) as exc:
            copy()
        assert words in str(exc.value)
    assert not dst.any()


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 5), width=st.integers(1, 8), stride=st.integers(0, 12), offset=st.integers(0, 8),
       data=st.data())
def test_any_strided_destination_is_refused_or_written_exactly(n, width, stride, offset, data):
    """Whatever view a caller hands in: a ValueError, or exactly the named rows written with
    their source rows and every other byte of the storage as it was."""
    storage = torch.zeros(48, dtype=torch.uint8)
    try:
        dst = storage.as_strided((n, width), (stride, 1), offset)
    except RuntimeError:
        return  # torch itself refuses a view past the storage
    src = rows(n, width)
    k = data.draw(st.integers(0, n))
    dst_ids = np.array(data.draw(st.permutations(range(n)))[:k], dtype=np.int64)
    src_ids = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)), dtype=np.int64)
    path = data.draw(st.sampled_from(["table", "groups"]))
    try:
        if path == "table":
            RowTable([(src, dst)]).copy(src_ids, dst_ids)
        else:
            copy_block_groups([(src, dst, src_ids, dst_ids)])
    except ValueError:
        assert not storage.any()
        return
    expected = torch.zeros(48, dtype=torch.uint8)
    for s, d in zip(src_ids, dst_ids):
        start = offset + int(d) * stride
        expected[start:start + width] = src[int(s)]
    assert torch.equal(storage, expected)
