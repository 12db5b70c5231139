"""Parallel sampling and beam search on shared blocks (fork + copy-on-write), and the watermark."""

import torch

from kvoffload.engine import LLM, EngineConfig, SamplingParams
from tests.engine.helpers import fake_run, make_request, make_scheduler

PROMPT = list(range(10, 47))  # 37 tokens at block size 8: 4 full blocks + a 5-token partial one


def manual_step(llm):
    so = llm.scheduler.schedule()
    out = llm.runner.execute_model(so)
    llm.scheduler.update_from_output(so, out)
    return so


def test_fork_shares_blocks_then_copy_on_write_copies_only_the_partial_block():
    llm = LLM(EngineConfig(block_size=8, num_gpu_blocks=32))
    llm.add_request(PROMPT, SamplingParams(max_tokens=4, temperature=0.7, seed=3, n=3, ignore_eos=True), "p")
    so = manual_step(llm)  # prefill; the parent samples 3 first tokens and forks twice
    kvm = llm.kv_cache_manager
    parent = kvm.get_blocks("p").blocks[0]
    assert [b.block_id for b in parent] == [1, 2, 3, 4, 5]
    for child in ("p#1", "p#2"):
        assert [b.block_id for b in kvm.get_blocks(child).blocks[0]] == [1, 2, 3, 4, 5]
    assert [b.ref_cnt for b in parent] == [3] * 5
    assert so.blocks_to_copy == [] and kvm.num_forks == 2 and kvm.num_cow_copies == 0
    partial_before = llm.runner.kv_caches[0][:, 5, :5].clone()

    so = manual_step(llm)  # first decode of all three: each write hits the shared partial block
    assert len(so.blocks_to_copy) == 2 and all(src == 5 for src, _ in so.blocks_to_copy)
    assert kvm.num_cow_copies == 2  # the full blocks 1-4 are never copied
    for layer in llm.runner.kv_caches:
        for src, dst in so.blocks_to_copy:
            assert torch.equal(layer[:, dst, :5], layer[:, src, :5])  # history bytes identical
    assert torch.equal(llm.runner.kv_caches[0][:, 5, :5], partial_before)
    tables = {rid: [b.block_id for b in kvm.get_blocks(rid).blocks[0]] for rid in ("p", "p#1", "p#2")}
    assert len({t[4] for t in tables.values()}) == 3  # each sequence now owns its last block
    assert all(t[:4] == [1, 2, 3, 4] for t in tables.values())
    assert [b.ref_cnt for b in parent[:4]] == [3] * 4 and parent[4].ref_cnt == 1
    llm.close()


def test_parallel_samples_equal_single_runs_and_use_fewer_blocks():
    params = SamplingParams(max_tokens=10, temperature=0.9, seed=7, n=4, ignore_eos=True)
    peak = {"blocks": 0}

    def tracking(llm):
        original = llm.step

        def step():
            done = original()
            pool = llm.kv_cache_manager.block_pool
            peak["blocks"] = max(peak["blocks"], pool.num_blocks - 1 - pool.get_num_free_blocks())
            return done

        llm.step = step
        return llm

    with tracking(LLM(EngineConfig(block_size=8, num_gpu_blocks=64, enable_prefix_caching=False))) as llm:
        out = llm.generate([PROMPT], params)[0]
        shared_peak = peak["blocks"]
        assert llm.stats()["forks"] == 3
    assert len(out.samples) == 4 and out.samples[0] == out.token_ids
    peak["blocks"] = 0
    with tracking(LLM(EngineConfig(block_size=8, num_gpu_blocks=64, enable_prefix_caching=False))) as llm:
        alone = llm.generate([PROMPT] * 4, [SamplingParams(max_tokens=10, temperature=0.9, seed=7 + i, ignore_eos=True)
                                            for i in range(4)])
        independent_peak = peak["blocks"]
    assert [o.token_ids for o in alone] == out.samples
    assert len({tuple(s) for s in out.samples}) > 1
    assert shared_peak < independent_peak  # measured: 4 sequences share the prompt's 4 full blocks


def test_beam_search_width_one_is_greedy_and_width_four_scores_at_least_as_well():
    with LLM(EngineConfig(block_size=8, num_gpu_blocks=64)) as llm:
        greedy = llm.generate([PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))[0]
        one = llm.generate([PROMPT], SamplingParams(max_tokens=8, beam_width=1, ignore_eos=True))[0]
        four = llm.generate([PROMPT], SamplingParams(max_tokens=8, beam_width=4, ignore_eos=True))[0]
        pool = llm.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_blocks - 1  # every beam released its blocks
        assert llm.stats()["forks"] > 0
    assert one.token_ids == greedy.token_ids
    assert len(four.samples) == 4 and four.scores == sorted(four.scores, reverse=True)
    assert four.scores[0] >= one.scores[0]


def test_watermark_keeps_waiting_requests_out_while_running_ones_need_room():
    sched = make_scheduler(num_blocks=11, block_size=4, budget=64)  # 10 usable blocks
    sched.watermark_blocks = 3
    sched.add_request(make_request("a", 15, max_tokens=8))  # 4 blocks (its first decode fits too)
    fake_run(sched, sched.schedule())
    sched.add_request(make_request("b", 12, max_tokens=8, start=100))  # 3 more would leave 3 free
    so = sched.schedule()
    assert "b" in so.num_scheduled_tokens
    fake_run(sched, so)
    sched.add_request(make_request("c", 4, max_tokens=8, start=200))  # a and b grow: 1 block left < 3
    so = sched.schedule()
    assert "c" not in so.num_scheduled_tokens and set(so.num_scheduled_tokens) == {"a", "b"}
    # With nothing running, the watermark does not block admission.
    idle = make_scheduler(num_blocks=5, block_size=4)
    idle.watermark_blocks = 3
    idle.add_request(make_request("x", 12, max_tokens=1))
    assert "x" in idle.schedule().num_scheduled_tokens


def test_swap_preemption_restores_kv_instead_of_recomputing():
    prompts = [[(i * 17 + j) % 250 for j in range(40 + 7 * i)] for i in range(6)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    def run(**kw):
        with LLM(EngineConfig(block_size=8, **kw)) as llm:
            return [o.token_ids for o in llm.generate(prompts, params)], llm.stats()

    tight = dict(num_gpu_blocks=20, max_num_batched_tokens=128)
    free, _ = run(num_gpu_blocks=128)
    recompute, rs = run(**tight)
    swapped, ss = run(**tight, preemption_mode="swap", kv_offload={"tiers": [{"medium": "cpu", "capacity": "16MiB"}]})
    assert free == recompute == swapped
    assert rs["preemptions"] > 0 and rs["recomputed_after_preemption"] > 0
    assert ss["preemptions"] > 0 and ss["swapped_out_tokens"] > 0
    assert ss["recomputed_after_preemption"] == 0  # every swapped request resumed from its KV
    assert ss["connector"]["swapped_in_blocks"] > 0


def test_swap_without_offload_is_a_config_error():
    import pytest

    with pytest.raises(ValueError, match="preemption_mode='swap' needs an offload tier"):
        EngineConfig(preemption_mode="swap")
