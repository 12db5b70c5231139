"""The sliding-window KV-cache group: hits found from the right, blocks out of the window released
while the request runs (so a long request holds about one window), the null block in their place."""

from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.request import Request
from kvoffload.engine.sampling_params import SamplingParams


def _request(rid, n, start=0):
    return Request(rid, [start + i for i in range(n)], SamplingParams(max_tokens=4), block_size=4)


def test_a_long_request_holds_about_one_window_per_sliding_group():
    kvm = KVCacheManager(64, 4, 1024, windows=(None, 8))
    req = _request("a", 40)
    computed = 0
    while computed < 40:  # prefill in chunks of 8 tokens, as the scheduler would
        assert kvm.allocate_slots(req, 8) is not None
        computed += 8
        req.num_computed_tokens = computed
    full, sliding = kvm.get_blocks("a").blocks
    assert len(full) == len(sliding) == 10 and not any(b.is_null for b in full)
    real = [b for b in sliding if not b.is_null]
    # The next chunk's first token (position 32 when allocated) attends to positions >= 25: blocks 6..9.
    assert [b.block_id for b in real] == [b.block_id for b in sliding[6:]] and all(b.is_null for b in sliding[:6])
    assert kvm.block_pool.get_num_free_blocks() == 63 - 10 - 4  # released blocks went back to the pool
    kvm.free(req)
    assert kvm.block_pool.is_empty()


def test_sliding_hits_need_only_the_window_before_their_end():
    kvm = KVCacheManager(64, 4, 1024, windows=(None, 8))
    req = _request("a", 40)
    assert kvm.allocate_slots(req, 40) is not None  # one chunk: every block is written and cached
    req.num_computed_tokens = 40
    kvm.free(req)
    again = _request("b", 41)  # same 40 tokens and one more
    blocks, hit = kvm.get_computed_blocks(again)
    assert hit == 40
    full, sliding = blocks.blocks
    assert len(sliding) == 10 and all(b.is_null for b in sliding[:8]) and not any(b.is_null for b in sliding[8:])
    # Evict the sliding group's block 9 (reuse every free block): the hit must shrink, all groups alike.
    kvm.block_pool.cached_block_hash_to_block.pop((again.block_hashes[9], 1))
    blocks, hit = kvm.get_computed_blocks(again)
    assert hit == 36 and [len(g) for g in blocks.blocks] == [9, 9]


def test_a_request_too_large_for_the_whole_cache_fails_with_a_message():
    import pytest

    from kvoffload.engine import LLM, EngineConfig

    cfg = EngineConfig(model="tiny-hybrid", block_size=8, num_gpu_blocks=40, max_num_batched_tokens=256)
    with LLM(cfg) as llm, pytest.raises(RuntimeError, match=r"than the whole cache has \(39, 4 KV-cache"):
        llm.generate([[1] * 200])
