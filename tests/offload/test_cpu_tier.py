"""Scenario tests of the block ledger with small integer hashes (exact ids and events)."""

import numpy as np
import pytest

from kvoffload.offload import (
    BlockNotReadyError,
    BlockStatus,
    CPULoadStoreSpec,
    CPUOffloadingManager,
    LRUCachePolicy,
    OffloadingEvent,
)

POLICIES = ["lru", "arc"]


def ids(spec) -> list[int]:
    assert isinstance(spec, CPULoadStoreSpec) and spec.block_ids.dtype == np.int64
    return spec.block_ids.tolist()


def stored(mgr, hashes):
    out = mgr.prepare_store(hashes)
    mgr.complete_store(out.block_hashes_to_store)
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_store_complete_load_evict_sequence(policy):
    mgr = CPUOffloadingManager(4, cache_policy=policy, enable_events=True, block_size=16)
    out = mgr.prepare_store([1, 2, 3])
    assert out.block_hashes_to_store == [1, 2, 3] and ids(out.store_spec) == [0, 1, 2]
    assert out.block_hashes_evicted == []
    assert mgr.lookup([1, 2, 3]) == 0  # written, not ready
    mgr.complete_store([1, 2, 3])
    assert mgr.lookup([1, 2, 3, 9]) == 3
    assert mgr.lookup([2, 1]) == 2 and mgr.lookup([9, 1]) == 0
    assert mgr.take_events() == [OffloadingEvent([1, 2, 3], 16, "CPU", False)]
    assert mgr.take_events() == []

    # Already-present hashes are skipped; one fresh slot (3) is left.
    out = mgr.prepare_store([2, 3, 4])
    assert out.block_hashes_to_store == [4] and ids(out.store_spec) == [3]
    mgr.complete_store([4])

    assert ids(mgr.prepare_load([1, 4])) == [0, 3]
    mgr.touch([1])
    # Full pool: 1 and 4 are pinned by the load, 2 is protected, so 3 goes (LRU order 2,3 < 1).
    out = mgr.prepare_store([2, 5])
    assert out.block_hashes_to_store == [5] and out.block_hashes_evicted == [3]
    assert ids(out.store_spec) == [2]
    mgr.complete_store([5])
    mgr.complete_load([1, 4])
    assert mgr.take_events() == [
        OffloadingEvent([4], 16, "CPU", False),
        OffloadingEvent([3], 16, "CPU", True),
        OffloadingEvent([5], 16, "CPU", False),
    ]
    assert mgr.lookup([1]) == 1 and mgr.lookup([3]) == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_store_into_pool_whose_blocks_are_all_read_returns_none_and_changes_nothing(policy):
    mgr = CPUOffloadingManager(2, cache_policy=policy, enable_events=True)
    stored(mgr, [1, 2])
    mgr.take_events()
    mgr.prepare_load([1, 2])
    assert mgr.prepare_store([3]) is None
    assert mgr.take_events() == []
    assert mgr.lookup([1, 2]) == 2 and mgr.lookup([3]) == 0
    mgr.complete_load([1, 2])
    out = mgr.prepare_store([3])
    assert out.block_hashes_evicted == [1] and ids(out.store_spec) == [0]


@pytest.mark.parametrize("policy", POLICIES)
def test_block_being_written_is_not_loadable_nor_evictable(policy):
    mgr = CPUOffloadingManager(1, cache_policy=policy)
    mgr.prepare_store([1])
    with pytest.raises(BlockNotReadyError, match="still being written"):
        mgr.prepare_load([1])
    assert mgr.prepare_store([2]) is None
    with pytest.raises(BlockNotReadyError, match="not stored"):
        mgr.prepare_load([7])


@pytest.mark.parametrize("policy", POLICIES)
def test_failed_store_frees_slot_and_emits_nothing_stored(policy):
    mgr = CPUOffloadingManager(3, cache_policy=policy, enable_events=True)
    out = mgr.prepare_store([1, 2])
    mgr.complete_store([1, 2], success=False)
    assert mgr.take_events() == []
    assert mgr.lookup([1]) == 0 and mgr.num_free_blocks == 3
    # Freed ids are reused last-freed-first, after the never-used id 2.
    assert ids(mgr.prepare_store([7, 8, 9]).store_spec) == [2, 1, 0]
    assert ids(out.store_spec) == [0, 1]


@pytest.mark.parametrize("policy", POLICIES)
def test_complete_store_leaves_ready_blocks_alone(policy):
    mgr = CPUOffloadingManager(2, cache_policy=policy, enable_events=True)
    stored(mgr, [1])
    mgr.take_events()
    mgr.complete_store([1], success=False)  # ready already: untouched
    assert mgr.lookup([1]) == 1 and mgr.take_events() == []


@pytest.mark.parametrize("policy", POLICIES)
def test_storing_nothing_returns_empty_output(policy):
    mgr = CPUOffloadingManager(2, cache_policy=policy)
    stored(mgr, [1])
    out = mgr.prepare_store([1])
    assert out is not None and out.block_hashes_to_store == [] and ids(out.store_spec) == []


def test_lru_touch_order_evicts_request_tail_first():
    mgr = CPUOffloadingManager(4, cache_policy="lru")
    stored(mgr, [1, 2, 3, 4])
    mgr.touch([3, 4, 1])  # 3 ends most recent, then 4, then 1; 2 untouched
    order = [mgr.index.debug_snapshot().hashes[s] for s in mgr.index.policy.order.oldest_first()]
    assert order == [2, 1, 4, 3]
    out = mgr.prepare_store([5, 6, 7])
    assert out.block_hashes_evicted == [2, 1, 4]


def test_eviction_is_atomic():
    mgr = CPUOffloadingManager(3, cache_policy="lru")
    stored(mgr, [1, 2, 3])
    mgr.prepare_load([2])
    assert mgr.prepare_store([4, 5, 6]) is None  # needs 3 victims, only 2 evictable
    assert mgr.lookup([1]) == 1 and mgr.lookup([3]) == 1
    out = mgr.prepare_store([4, 5])
    assert out.block_hashes_evicted == [1, 3]


def test_load_errors():
    mgr = CPUOffloadingManager(2)
    stored(mgr, [1])
    with pytest.raises(ValueError, match="without a matching prepare_load"):
        mgr.complete_load([1])
    with pytest.raises(ValueError, match="num_blocks=0"):
        CPUOffloadingManager(0)


def test_unknown_policy_lists_known_ones():
    with pytest.raises(ValueError, match="known: .*arc.*lru"):
        CPUOffloadingManager(4, cache_policy="mru")


class DictLRU(LRUCachePolicy.__mro__[2]):  # a textbook CachePolicy keeping BlockStatus objects
    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        from collections import OrderedDict

        self.blocks = OrderedDict()

    def get(self, h):
        return self.blocks.get(h)

    def insert(self, h, block):
        self.blocks[h] = block

    def remove(self, h):
        self.blocks.pop(h, None)

    def touch(self, hashes):
        for h in reversed(list(hashes)):
            if h in self.blocks:
                self.blocks.move_to_end(h)

    def evict(self, n, protected):
        victims = [(h, b) for h, b in self.blocks.items() if b.ref_cnt == 0 and h not in protected][:n]
        if len(victims) < n:
            return None
        for h, _ in victims:
            del self.blocks[h]
        return victims


@pytest.mark.parametrize("policy", ["lru", DictLRU(4)], ids=["builtin", "external-instance"])
def test_external_policy_instance_behaves_like_builtin(policy):
    mgr = CPUOffloadingManager(4, cache_policy=policy)
    stored(mgr, [1, 2, 3, 4])
    mgr.prepare_load([1])
    mgr.touch([2])
    out = mgr.prepare_store([5, 6])
    assert out.block_hashes_evicted == [3, 4] and ids(out.store_spec) == [3, 2]
    mgr.complete_load([1])


def test_block_status_record_and_standalone_policy():
    status = BlockStatus(5)
    assert status.ref_cnt == -1 and not status.is_ready
    policy = LRUCachePolicy(8)
    policy.insert("a", status)
    status.ref_cnt = 0  # the adopted record is a live view
    policy.insert("b", BlockStatus(6, ref_cnt=0))
    assert policy.get("a").ref_cnt == 0 and policy.get("zz") is None
    policy.touch(["a"])
    (victim,) = policy.evict(1, protected=set())
    assert victim[0] == "b" and victim[1].block_id == 6
    assert policy.get("b") is None
    assert policy.evict(1, protected={"a"}) is None
