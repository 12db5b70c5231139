import pytest

from kvoffload.offload import CPUOffloadingManager, FilterReusedOffloadingManager


def prefix(n):
    return list(range(n))


def test_prefix_admitted_on_second_request_not_after_2n_plus_1():
    mgr = FilterReusedOffloadingManager(CPUOffloadingManager(64), store_threshold=2)
    blocks = prefix(8)
    # Request 1 looks the prefix up (misses) and offers its 8 blocks for store.
    assert mgr.lookup(blocks) == 0
    out = mgr.prepare_store(blocks)
    assert out.block_hashes_to_store == [] and mgr.num_filtered == 8
    # Request 2: same prefix; its offer is the second sighting of every block.
    assert mgr.lookup(blocks) == 0
    out = mgr.prepare_store(blocks)
    assert out.block_hashes_to_store == blocks
    mgr.complete_store(blocks)
    assert mgr.lookup(blocks) == 8


def test_lookups_do_not_count_as_sightings():
    mgr = FilterReusedOffloadingManager(CPUOffloadingManager(8), store_threshold=2)
    for _ in range(5):
        mgr.lookup([1, 2])
    assert mgr.prepare_store([1, 2]).block_hashes_to_store == []


def test_none_from_backing_leaves_counts_unchanged():
    backing = CPUOffloadingManager(1)
    mgr = FilterReusedOffloadingManager(backing, store_threshold=2)
    mgr.prepare_store([1])
    mgr.prepare_store([1])  # second sighting: admitted, stored (not ready yet)
    mgr.prepare_store([2])  # first sighting of 2
    counts_before = dict(mgr.counts)
    assert mgr.prepare_store([2]) is None  # admitted, but the only slot is being written
    assert dict(mgr.counts) == counts_before
    backing.complete_store([1])
    out = mgr.prepare_store([2])  # the retry is the second sighting, not the third
    assert out.block_hashes_to_store == [2] and mgr.counts[2] == 2


def test_tracker_bounded_oldest_dropped():
    mgr = FilterReusedOffloadingManager(CPUOffloadingManager(8), store_threshold=3, max_tracker_size=3)
    for h in [1, 2, 3, 1, 4]:
        mgr.prepare_store([h])
    assert list(mgr.counts) == [3, 1, 4] and mgr.counts[1] == 2  # 2 was the oldest, dropped
    assert len(mgr.counts) == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="store_threshold=1"):
        FilterReusedOffloadingManager(CPUOffloadingManager(4), store_threshold=1)
    with pytest.raises(ValueError, match="max_tracker_size=0"):
        FilterReusedOffloadingManager(CPUOffloadingManager(4), max_tracker_size=0)


def test_delegates_load_path():
    mgr = FilterReusedOffloadingManager(CPUOffloadingManager(4), store_threshold=2)
    mgr.prepare_store([5])
    mgr.prepare_store([5])
    mgr.complete_store([5])
    assert mgr.prepare_load([5]).block_ids.tolist() == [0]
    mgr.complete_load([5])
    assert mgr.medium == "CPU"
