"""Defect 4: parallel sampling and beam search under device-cache pressure; refusals up front."""

import random

import pytest
import torch

from kvoffload.engine import LLM, EngineConfig, SamplingParams

torch.set_num_threads(1)


def _prompts(n=12, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, 250) for _ in range(rng.randrange(40, 90))] for _ in range(n)]


def _one_by_one(cfg, prompts, params):
    """Reference: each prompt alone in a roomy engine (no preemption)."""
    with LLM(EngineConfig(num_gpu_blocks=256, max_num_seqs=cfg.max_num_seqs)) as llm:
        return [llm.generate([p], params)[0] for p in prompts]


@pytest.mark.parametrize("blocks", [60, 40, 30])
def test_parallel_sampling_children_survive_preemption(blocks):
    prompts = _prompts()
    params = SamplingParams(max_tokens=24, n=4, temperature=0.8, seed=1, ignore_eos=True)
    cfg = EngineConfig(num_gpu_blocks=blocks, max_num_seqs=8)
    with LLM(cfg) as llm:
        outs = llm.generate(prompts, params)
        assert llm.stats()["preemptions"] > 0
        again = llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # the engine still serves
    assert all(len(o.samples) == 4 and all(len(s) == 24 for s in o.samples) for o in outs)
    assert [o.samples for o in outs] == [o.samples for o in _one_by_one(cfg, prompts, params)]
    assert len(again) == 2


@pytest.mark.parametrize("blocks", [60, 40])
def test_beam_search_under_pressure_finishes_with_the_same_beams(blocks):
    prompts = _prompts(8)
    params = SamplingParams(max_tokens=12, beam_width=4, ignore_eos=True)
    cfg = EngineConfig(num_gpu_blocks=blocks, max_num_seqs=8)
    with LLM(cfg) as llm:
        outs = llm.generate(prompts, params)
        assert llm.stats()["preemptions"] > 0
    ref = _one_by_one(cfg, prompts, params)
    assert [o.samples for o in outs] == [o.samples for o in ref]


@pytest.mark.parametrize("params, match", [
    (SamplingParams(n=10**6), "n=1000000 sequences never run at once with max_num_seqs=32"),
    (SamplingParams(beam_width=64), "beam_width=64 sequences never run at once"),
    (SamplingParams(beam_width=8, max_tokens=200), "beam_width=8 needs .* KV blocks at once"),
])
def test_requests_that_can_never_fit_are_refused_up_front(params, match):
    with LLM(EngineConfig(num_gpu_blocks=64)) as llm:
        with pytest.raises(ValueError, match=match):
            llm.generate([[1, 2, 3]], params)
        assert not llm.scheduler.has_unfinished_requests()


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": float("nan")}, "temperature=nan: must be a finite number"),
    ({"max_tokens": 2.5}, "max_tokens=2.5: must be an integer"),
    ({"top_p": float("inf")}, "top_p=inf"),
    ({"seed": "7"}, "seed='7': must be an integer"),
    ({"n": True}, "n=True: must be an integer"),
])
def test_bad_sampling_inputs_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_a_bad_batch_enqueues_nothing():
    with LLM(EngineConfig()) as llm:
        with pytest.raises(TypeError, match="must be a SamplingParams"):
            llm.generate([[1, 2, 3]], {"max_tokens": 4})
        with pytest.raises(ValueError, match="outside the vocabulary"):
            llm.generate([[1, 2, 3], [1, 10**9]], SamplingParams(max_tokens=4))
        with pytest.raises(TypeError, match="list of integer token ids"):
            llm.generate([[1, 2, 3], [1.5, 2.0]], SamplingParams(max_tokens=4))
        assert not llm.scheduler.has_unfinished_requests()
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3))
        assert len(out[0].token_ids) == 3 and out[0].request_id == "req-0"


def _chaos_prompts(seed):
    rng = random.Random(seed * 31 + 7)
    prefixes = [[rng.randrange(1, 250) for _ in range(rng.randrange(16, 80))] for _ in range(3)]
    return [rng.choice(prefixes) + [rng.randrange(1, 250) for _ in range(rng.randrange(8, 72))] for _ in range(10)]


@pytest.mark.parametrize("seed", [1010, 1011, 1026, 1038])
def test_beam_search_with_swap_preemption_matches_the_reference(seed):
    # Found by the chaos suite: a stalled beam preempted to make room had its swap-out copy
    # left running while its blocks were reused; a preempted beam could finish in the queue
    # (on candidates it had reported) and still be scheduled; a copy-on-write planned in the
    # step that preempted its request was swapped out before it ran.
    prompts, params = _chaos_prompts(seed), SamplingParams(max_tokens=8, beam_width=2, ignore_eos=True)
    with LLM(EngineConfig(num_gpu_blocks=20, max_num_seqs=8, max_num_batched_tokens=256)) as llm:
        expected = [o.samples for o in llm.generate(prompts, params)]
    offload = {"tiers": [{"medium": "cpu", "capacity": 512 * 8192}]}
    cfg = EngineConfig(num_gpu_blocks=20, max_num_seqs=8, max_num_batched_tokens=256, kv_offload=offload,
                       preemption_mode="swap")
    with LLM(cfg) as llm:
        got = [o.samples for o in llm.generate(prompts, params)]
        assert llm.stats()["swapped_out_tokens"] > 0
    assert got == expected
