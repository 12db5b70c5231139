"""Offload with a hybrid model's KV-cache groups (Gemma 3 shaped: 1 full-attention group and 3
sliding-window groups): per-group keys, a sliding group loads only the window before the hit's
end, a hit is all-or-nothing over the groups, and a sliding block the engine released and handed
out again is never stored with another request's KV."""

from types import SimpleNamespace

import pytest
import torch

from kvoffload.config import OffloadConfig
from kvoffload.connector.group_keys import GroupGeometry, group_key
from kvoffload.connector.scheduler.offloading_scheduler import OffloadingConnectorScheduler
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.offload.spec import EngineKVInfo, OffloadingSpecFactory

torch.set_num_threads(1)
PROMPTS = [[1 + (i * 7 + j * 13) % 250 for j in range(n)] for i, n in enumerate((40, 100, 200, 150))]
SP = SamplingParams(max_tokens=8, ignore_eos=True)
WINDOW = 32  # the tiny-hybrid model's


def _run(kv_offload, num_gpu_blocks=400, budget=64):
    cfg = EngineConfig(model="tiny-hybrid", block_size=8, num_gpu_blocks=num_gpu_blocks, max_num_batched_tokens=budget,
                       kv_offload=kv_offload)
    with LLM(cfg) as llm:
        first = [o.token_ids for o in llm.generate(PROMPTS, SP)]
        assert llm.reset_prefix_cache()  # round 2 can only hit the offload tiers
        second = [o.token_ids for o in llm.generate(PROMPTS, SP)]
        return first, second, llm.stats()


@pytest.fixture(scope="module")
def reference():
    return _run(None)


@pytest.mark.parametrize("factor", [1, 2])
@pytest.mark.parametrize("disk", [False, True], ids=["cpu", "cpu+disk"])
def test_hybrid_tokens_identical_and_sliding_groups_load_one_window(reference, tmp_path, factor, disk):
    tiers = [{"medium": "cpu", "capacity": "8MiB"}]
    if disk:
        tiers.append({"medium": "disk", "path": str(tmp_path), "capacity": "16MiB", "write_through": True})
    first, second, stats = _run({"tiers": tiers, "offloaded_block_size": 8 * factor})
    assert (first, second) == reference[:2]
    assert stats["preemptions"] == 0  # so every count below is of one admission per request
    hit_tokens = stats["external_hit_tokens"]
    # Every prompt hits all its whole offloaded blocks (the engine then recomputes the last token).
    obs = 8 * factor
    assert hit_tokens == sum(len(p) // obs * obs for p in PROMPTS)
    full_blocks = hit_tokens // obs
    geo = GroupGeometry((None, WINDOW, WINDOW, WINDOW), 8, factor)
    window_blocks = sum(n - geo.first_needed(1, n) for n in (len(p) // obs for p in PROMPTS))
    # One full group loads every hit block; each sliding group only its window.
    assert stats["connector"]["loaded_blocks"] == full_blocks + 3 * window_blocks
    assert stats["connector"]["loaded_blocks"] < 4 * full_blocks


def test_released_sliding_blocks_are_flushed_never_stored_with_other_kv(reference):
    # A pool this small hands sliding-window blocks out again within a step or two (the 200-token
    # prompt alone needs 25 full-group blocks and 3 x 9 sliding ones per 32-token chunk).
    ref_first, ref_second, _ = _run(None, num_gpu_blocks=56, budget=32)
    first, second, stats = _run({"tiers": [{"medium": "cpu", "capacity": "8MiB"}]}, num_gpu_blocks=56, budget=32)
    assert (first, second) == (ref_first, ref_second) == reference[:2]
    assert stats["external_hit_tokens"] > 0


def _sched(windows, block_size=4):
    cfg = OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": 64 * 100}]})
    info = EngineKVInfo(block_size=block_size, block_bytes=100, num_device_blocks=64, group_windows=windows)
    return OffloadingConnectorScheduler(OffloadingSpecFactory.create_spec(cfg, info))


def _store(sched, keys):
    sched.manager.prepare_store(keys)
    sched.manager.complete_store(keys)


def test_a_hit_is_all_or_nothing_over_the_groups():
    sched = _sched((None, 16))
    hashes = [bytes([i]) * 16 for i in range(10)]
    request = SimpleNamespace(request_id="r", kv_transfer_params=None, cache_salt=None, output_token_ids=[], num_tokens=41, num_computed_tokens=0, block_hashes=hashes)
    _store(sched, hashes)  # the full group: every block
    _store(sched, [group_key(h, 1) for h in hashes[:6]])  # the sliding group lost blocks 6..9
    # A hit of n blocks needs the sliding group's blocks n-4..n-1 (window 16 = 4 blocks of 4):
    # only n = 6 has them, so the full group's 10-block hit shrinks to 6 as well.
    assert sched.get_num_new_matched_tokens(request, 0) == (24, True)
    _store(sched, [group_key(h, 1) for h in hashes[6:]])
    assert sched.get_num_new_matched_tokens(request, 0) == (40, True)
    assert group_key(hashes[0], 0) == hashes[0]  # group 0 keeps the plain keys
    # A sliding block outside the last window does not matter; one inside it cuts the hit there.
    for lost, hit_blocks in ((3, 10), (8, 8)):
        sched2 = _sched((None, 16))
        _store(sched2, hashes)
        _store(sched2, [group_key(h, 1) for i, h in enumerate(hashes) if i != lost])
        assert sched2.get_num_new_matched_tokens(request, 0) == (4 * hit_blocks, True), lost


def test_sliding_window_geometry():
    geo = GroupGeometry((None, 32), block_size=8, factor=1)
    assert [geo.first_needed(1, n) for n in (1, 4, 5, 10)] == [0, 0, 1, 6]
    assert geo.first_needed(0, 10) == 0
    geo2 = GroupGeometry((None, 32), block_size=8, factor=2)  # offloaded blocks of 16 tokens
    assert [geo2.first_needed(1, n) for n in (1, 2, 3, 5)] == [0, 0, 1, 3]


def _step(new=(), cached=(), scheduled=None):
    """A ScheduledStep: new requests (id, block ids per group), cached ones (id, new block ids)."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=rid, block_ids=ids) for rid, ids in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached], resumed_from_preemption=[False] * len(cached),
                                              new_block_ids=[ids for _, ids in cached]),
        num_scheduled_tokens=scheduled or {}, preempted_req_ids=set(), block_replacements={})


def test_a_store_reading_a_released_sliding_block_is_flushed_before_the_block_is_reused():
    sched = _sched((None, 8))
    hashes = [bytes([i]) * 16 for i in range(4)]
    r = SimpleNamespace(request_id="r", kv_transfer_params=None, cache_salt=None, output_token_ids=[], num_tokens=16, num_computed_tokens=0, block_hashes=hashes)
    sched.get_num_new_matched_tokens(r, 0)
    sched.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4], [5, 6, 7, 8]), blocks=()), 0)
    meta = sched.build_connector_meta(_step(new=[("r", ([1, 2, 3, 4], [5, 6, 7, 8]))], scheduled={"r": 16}))
    (full_job, sliding_job) = meta.reqs_to_store["r"]
    assert full_job.src.block_ids.tolist() == [1, 2, 3, 4] and sliding_job.src.block_ids.tolist() == [5, 6, 7, 8]
    assert not meta.flush_jobs
    # Next step the engine released r's sliding blocks 5 and 6 (out of the window) and gave 6 to s.
    r.num_computed_tokens = 16
    meta = sched.build_connector_meta(_step(new=[("s", ([9], [6]))], cached=[("r", ([10], [11]))],
                                            scheduled={"s": 4, "r": 1}))
    assert meta.flush_jobs == {sliding_job.job_id}  # the worker waits for it before s writes block 6
    assert sched.stats.store_flushes == 1
    # Once the store landed, reusing its blocks needs no flush.
    from kvoffload.transfer.result import TransferResult
    sched.update_connector_output([TransferResult(j.job_id, True, 400, 0.001, "device_to_host") for j in (full_job, sliding_job)])
    assert not sched.build_connector_meta(_step(new=[("t", ([12], [7]))], scheduled={"t": 4})).flush_jobs


def test_a_store_not_planned_before_its_sliding_block_was_handed_out_again_is_skipped():
    sched = _sched((None, 8))
    hashes = [bytes([i]) * 16 for i in range(4)]
    r = SimpleNamespace(request_id="r", kv_transfer_params=None, cache_salt=None, output_token_ids=[], num_tokens=16, num_computed_tokens=0, block_hashes=hashes)
    sched.get_num_new_matched_tokens(r, 0)
    sched.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: ([1, 2], [5, 6]), blocks=()), 0)
    sched.build_connector_meta(_step(new=[("r", ([1, 2], [5, 6]))]))  # nothing computed yet: no stores
    # Block 5 was released and given to s before r's first store was planned.
    meta = sched.build_connector_meta(_step(new=[("s", ([9], [5]))], cached=[("r", ([3, 4], [7, 8]))],
                                            scheduled={"r": 16, "s": 4}))
    jobs = {tuple(j.src.block_ids.tolist()) for j in meta.reqs_to_store["r"]}
    assert jobs == {(1, 2, 3, 4), (6, 7, 8)}  # r's sliding block 5 is never read as r's KV


def test_swap_preemption_of_a_hybrid_model_restores_every_groups_window():
    """Swap mode: a preempted request's full-attention blocks, its sliding groups' windows and
    each group's partial tail are saved and restored, not recomputed; tokens as without offload."""
    def run(kv_offload, mode):
        cfg = EngineConfig(model="tiny-hybrid", block_size=8, num_gpu_blocks=64, max_num_batched_tokens=32,
                           max_num_seqs=4, kv_offload=kv_offload, preemption_mode=mode)
        with LLM(cfg) as llm:
            outs = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]
            return outs, llm.stats()

    ref, ref_stats = run(None, "recompute")
    assert ref_stats["preemptions"] > 0
    got, stats = run({"tiers": [{"medium": "cpu", "capacity": "8MiB"}]}, "swap")
    assert got == ref
    assert stats["preemptions"] > 0 and stats["swapped_out_tokens"] > 0
    assert stats["connector"]["swapped_in_blocks"] > 0
    assert stats["recomputed_after_preemption"] < ref_stats["recomputed_after_preemption"]
