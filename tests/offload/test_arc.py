from kvoffload.offload import ARCCachePolicy, CPUOffloadingManager


def stored(mgr, hashes):
    out = mgr.prepare_store(hashes)
    mgr.complete_store(out.block_hashes_to_store)
    return out


def test_scan_cannot_evict_twice_touched_blocks():
    mgr = CPUOffloadingManager(4, cache_policy="arc")
    stored(mgr, [1, 2])
    mgr.touch([1, 2])  # ready T1 blocks touched again → T2
    policy = mgr.index.policy
    assert policy.t2.size == 2 and policy.t1.size == 0
    for h in range(100, 140):  # a one-off scan of new hashes
        out = stored(mgr, [h])
        assert 1 not in out.block_hashes_evicted and 2 not in out.block_hashes_evicted
    assert mgr.lookup([1, 2]) == 2


def test_touch_of_not_ready_block_stays_in_t1():
    mgr = CPUOffloadingManager(4, cache_policy="arc")
    mgr.prepare_store([1])
    mgr.touch([1])
    assert mgr.index.policy.t1.size == 1 and mgr.index.policy.t2.size == 0


def test_ghost_hits_move_target_both_ways():
    mgr = CPUOffloadingManager(2, cache_policy="arc")
    policy: ARCCachePolicy = mgr.index.policy
    stored(mgr, [1, 2])
    stored(mgr, [3])  # evicts 1 from T1 → B1
    assert list(policy.b1) == [1] and policy.target_t1_size == 0
    mgr.touch([1])  # B1 ghost hit: target += max(1, |B2|/|B1|) = 1
    assert policy.target_t1_size == 1.0
    assert mgr.lookup([1]) == 0  # ghosts are not re-admitted by touch
    mgr.touch([3])
    mgr.touch([3])  # 3 → T2
    stored(mgr, [4])  # |T1|=1 >= target 1 → evicts 2 from T1 → B1
    assert list(policy.b1) == [1, 2]
    stored(mgr, [5])  # T1 = {4} size 1 >= 1 → evict 4 → B1
    mgr.touch([4])  # B1 hit: += max(1, 0/3) = 1 → 2
    assert policy.target_t1_size == 2.0
    # T1={5} size 1 < target 2 → evict from T2: 3 → B2
    out = stored(mgr, [6])
    assert out.block_hashes_evicted == [3] and list(policy.b2) == [3]
    mgr.touch([3])  # B2 hit: -= max(1, |B1|/|B2|) = 3 → floored at 0
    assert policy.target_t1_size == 0.0


def test_evict_falls_back_to_other_list():
    mgr = CPUOffloadingManager(2, cache_policy="arc")
    policy = mgr.index.policy
    stored(mgr, [1, 2])
    mgr.touch([1])  # 1 → T2; T1 = {2}
    mgr.prepare_load([2])  # the only T1 block is pinned
    out = stored(mgr, [3])  # T1 preferred (size 1 >= target 0) but pinned → falls back to T2
    assert out.block_hashes_evicted == [1]
    assert list(policy.b2) == [1]


def test_ghost_lists_never_exceed_capacity():
    mgr = CPUOffloadingManager(3, cache_policy="arc")
    policy = mgr.index.policy
    for h in range(200):
        stored(mgr, [h])
        if h % 3 == 0:
            mgr.touch([h])
        if h % 7 == 0:
            mgr.touch([h - 5])
        assert len(policy.b1) <= 3 and len(policy.b2) <= 3
        assert policy.t1.size + policy.t2.size == mgr.num_used_blocks <= 3
