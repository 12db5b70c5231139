import pytest

from kvoffload.engine.free_queue import FreeKVCacheBlockQueue
from kvoffload.engine.kv_cache_block import KVCacheBlock


def ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def make(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def test_popleft_takes_head_in_order():
    blocks, q = make(4)
    assert q.popleft().block_id == 0
    assert q.popleft().block_id == 1
    assert ids(q) == [2, 3]
    assert q.num_free_blocks == 2


def test_remove_from_middle_is_unlinked():
    blocks, q = make(5)
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4]
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    assert blocks[1].next_free_block is blocks[3] and blocks[3].prev_free_block is blocks[1]
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(blocks[2])


def test_append_goes_to_tail_and_popleft_n():
    blocks, q = make(4)
    taken = q.popleft_n(3)
    assert [b.block_id for b in taken] == [0, 1, 2]
    assert ids(q) == [3]
    q.append_n([taken[2], taken[0]])
    assert ids(q) == [3, 2, 0]
    assert q.num_free_blocks == 3
    with pytest.raises(ValueError, match="asked for 4"):
        q.popleft_n(4)


def test_popleft_empty_raises():
    _, q = make(1)
    q.popleft()
    with pytest.raises(ValueError, match="no free blocks"):
        q.popleft()
    assert q.popleft_n(0) == []
