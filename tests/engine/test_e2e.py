import pytest

from kvoffload.engine import LLM, EngineConfig, SamplingParams

SYSTEM = list(range(10, 10 + 48))


def prompts():
    return [SYSTEM + [100 + i] * (5 + 3 * i) for i in range(6)]


def run(**kw):
    with LLM(EngineConfig(block_size=8, max_num_batched_tokens=96, **kw)) as llm:
        outs = llm.generate(prompts(), SamplingParams(max_tokens=10, ignore_eos=True))
        # A second round returns to the same prefixes.
        outs += llm.generate(prompts(), SamplingParams(max_tokens=10, ignore_eos=True))
        return [o.token_ids for o in outs], llm.stats()


def test_outputs_identical_with_prefix_caching_off_on_and_preempting():
    off, s_off = run(num_gpu_blocks=128, enable_prefix_caching=False)
    on, s_on = run(num_gpu_blocks=128)
    tight, s_tight = run(num_gpu_blocks=16)
    assert off == on == tight
    assert s_off["prefix_hit_tokens"]["device"] == 0
    assert s_on["prefix_hit_tokens"]["device"] > 0
    assert s_on["prefill_tokens_computed"] < s_off["prefill_tokens_computed"]
    assert s_tight["preemptions"] > 0


def test_seeded_sampling_reproducible_under_preemption():
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=50, seed=1234, ignore_eos=True)
    res = []
    for blocks in (128, 16):
        with LLM(EngineConfig(block_size=8, num_gpu_blocks=blocks)) as llm:
            res.append([o.token_ids for o in llm.generate(prompts(), params)])
    assert res[0] == res[1]
    assert len(set(map(tuple, res[0]))) > 1


def test_text_prompts_and_stats():
    with LLM(EngineConfig()) as llm:
        outs = llm.generate(["hello kvoffload", "hello kvoffload, again"], SamplingParams(max_tokens=3, ignore_eos=True))
        assert outs[0].prompt_token_ids == list(b"hello kvoffload")
        assert all(len(o.token_ids) == 3 for o in outs)
        st = llm.stats()
        assert st["requests"] == 2 and st["generated_tokens"] == 6
        assert st["prompt_tokens"] == len(b"hello kvoffload") + len(b"hello kvoffload, again")


@pytest.mark.parametrize(
    "prompt, kwargs, match",
    [
        ([], {}, "empty prompt"),
        ([1] * 64, {"max_model_len": 64}, "64 tokens, max_model_len=64"),
        ([1] * 40, {"num_gpu_blocks": 3}, "needs 3 KV blocks but num_gpu_blocks=3 holds 2"),
        ([5000], {}, "outside the vocabulary"),
    ],
)
def test_bad_requests_raise_clear_errors(prompt, kwargs, match):
    cfg = dict(block_size=16, max_num_batched_tokens=64)
    cfg.update(kwargs)
    with LLM(EngineConfig(**cfg)) as llm, pytest.raises(ValueError, match=match):
        llm.generate([prompt], SamplingParams(max_tokens=8))


@pytest.mark.parametrize(
    "field, value",
    [("block_size", 0), ("num_gpu_blocks", -1), ("max_model_len", 0), ("max_num_seqs", 0),
     ("max_num_batched_tokens", -5), ("num_gpu_blocks", 1), ("scheduling_policy", "lifo")],
)
def test_bad_engine_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="max_tokens=0"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature=-1"):
        SamplingParams(temperature=-1)
