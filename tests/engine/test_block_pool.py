import pytest

from kvoffload.engine.block_pool import BlockPool


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_null_block_is_block_zero_and_never_handed_out():
    pool = BlockPool(5, enable_caching=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert [b.block_id for b in pool.get_new_blocks(4)] == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_reverse_order_free_keeps_prefix_longest():
    pool = BlockPool(8, enable_caching=True)
    blocks = pool.get_new_blocks(3)  # 1, 2, 3 = a request's blocks, head first
    pool.cache_full_blocks(blocks, [b"h1", b"h2", b"h3"], 0, 3, group_id=0)
    pool.free_blocks(reversed(blocks))
    # Untouched blocks 4..7 first, then the freed request tail first: 3, 2, 1.
    assert free_ids(pool) == [4, 5, 6, 7, 3, 2, 1]
    new = pool.get_new_blocks(5)
    assert [b.block_id for b in new] == [4, 5, 6, 7, 3]
    # Reusing block 3 evicted its hash; the prefix h1, h2 survives.
    assert pool.get_cached_block(b"h3", [0]) is None
    assert pool.get_cached_block(b"h1", [0])[0].block_id == 1
    assert pool.get_cached_block(b"h2", [0])[0].block_id == 2
    assert pool.num_cache_evictions == 1


def test_touch_pulls_hit_out_of_middle_of_free_queue():
    pool = BlockPool(6, enable_caching=True)
    blocks = pool.get_new_blocks(5)
    pool.cache_full_blocks(blocks, [b"a", b"b", b"c", b"d", b"e"], 0, 5, group_id=0)
    pool.free_blocks(blocks)
    assert free_ids(pool) == [1, 2, 3, 4, 5]
    hit = pool.get_cached_block(b"c", [0])
    pool.touch(hit)
    assert hit[0].ref_cnt == 1
    assert free_ids(pool) == [1, 2, 4, 5]
    pool.free_blocks(hit)
    assert free_ids(pool) == [1, 2, 4, 5, 3]


def test_shared_block_returns_to_queue_only_at_zero():
    pool = BlockPool(4, enable_caching=True)
    (blk,) = pool.get_new_blocks(1)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    pool.free_blocks([blk])
    assert blk.block_id not in free_ids(pool)
    pool.free_blocks([blk])
    assert free_ids(pool)[-1] == blk.block_id


def test_reset_prefix_cache_refused_while_in_use():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"x", b"y"], 0, 2, group_id=0)
    assert pool.reset_prefix_cache() is False
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(b"x", [0]) is None
    assert all(b.block_hash is None for b in pool.blocks)


def test_lru_reuse_order_of_freed_blocks():
    pool = BlockPool(5, enable_caching=True)
    a = pool.get_new_blocks(2)
    b = pool.get_new_blocks(2)
    pool.free_blocks(reversed(b))
    pool.free_blocks(reversed(a))
    assert [x.block_id for x in pool.get_new_blocks(4)] == [4, 3, 2, 1]


def test_pool_needs_two_blocks():
    with pytest.raises(ValueError, match="num_gpu_blocks=1"):
        BlockPool(1, enable_caching=True)
