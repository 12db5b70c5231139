"""The engine loads a transformers Llama checkpoint and reproduces transformers' own outputs."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvoffload.engine import LLM, EngineConfig, SamplingParams  # noqa: E402

PROMPTS = [[(i * 7 + j * 13) % 297 for j in range(40 + i * 9)] for i in range(4)]
MAX_NEW = 12


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=298, eos_token_id=299)
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return model, str(path)


def hf_greedy(model, prompt):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        dict(num_gpu_blocks=64),
        dict(num_gpu_blocks=64, max_num_batched_tokens=32, long_prefill_token_threshold=16),
        dict(num_gpu_blocks=22, max_num_batched_tokens=64),  # small enough to preempt
    ],
    ids=["plain", "chunked", "preempting"],
)
def test_greedy_tokens_and_logits_match_transformers(hf_model, engine_kwargs):
    model, path = hf_model
    llm = LLM(EngineConfig(model=path, block_size=8, **engine_kwargs), record_logits=True)
    # Run twice so the second round is served from the device prefix cache.
    for _ in range(2):
        llm.last_logits.clear()
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
        for out, prompt in zip(outs, PROMPTS):
            assert out.token_ids == hf_greedy(model, prompt)
            with torch.no_grad():
                full = torch.tensor([prompt + out.token_ids[:-1]])
                ref_logits = model(full).logits[0, len(prompt) - 1:]
            ours = torch.stack(llm.last_logits[out.request_id])
            torch.testing.assert_close(ours, ref_logits, rtol=1e-4, atol=1e-4)
    stats = llm.stats()
    assert stats["prefix_hit_tokens"]["device"] > 0
    if engine_kwargs["num_gpu_blocks"] == 22:
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("theta", [50_000.0, 500_000.0])
def test_rope_base_from_rope_parameters_matches_transformers(tmp_path, theta):
    """transformers >= 5 saves the RoPE base under rope_parameters only: the engine used to read
    rope_theta, default to 10000 and generate other tokens than transformers."""
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=298, eos_token_id=299, rope_theta=theta)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    saved = (tmp_path / "config.json").read_text()
    assert '"rope_parameters"' in saved
    llm = LLM(EngineConfig(model=str(tmp_path), block_size=8, num_gpu_blocks=64), record_logits=True)
    assert llm.model_config.rope_theta == theta
    prompt = PROMPTS[3]
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    with torch.no_grad():
        ref_logits = model(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
    torch.testing.assert_close(torch.stack(llm.last_logits[out.request_id]), ref_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_scaled_rope_is_refused_naming_the_type(tmp_path, key):
    import json

    from kvoffload.engine.model_config import ModelConfig

    raw = {"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4,
           key: {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"RoPE type 'yarn' is not implemented by the bundled engine"):
        ModelConfig.from_pretrained(tmp_path)
