"""Gemma 3 (sliding-window + full-attention layers) on the bundled engine reproduces transformers'
own tokens and logits, at prompt lengths below and well above the window, also when the prefix
comes from the device cache (a sliding group's hit holds one window) and under preemption."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvoffload.engine import LLM, EngineConfig, SamplingParams  # noqa: E402

WINDOW = 64
# No token 0 (transformers would treat it as padding) and lengths around the window.
PROMPTS = [[1 + (i * 7 + j * 13) % 296 for j in range(n)] for i, n in enumerate((20, 50, 130, 200))]
MAX_NEW = 12


@pytest.fixture(scope="module")
def hf_gemma3(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"], query_pre_attn_scalar=16,
        bos_token_id=298, eos_token_id=299, pad_token_id=0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # norms scale by (1 + weight): random weights make that count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.3)
    path = tmp_path_factory.mktemp("tiny-gemma3")
    model.save_pretrained(path)
    return model, str(path)


def hf_greedy(model, prompt):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        dict(num_gpu_blocks=200),
        dict(num_gpu_blocks=200, max_num_batched_tokens=48, long_prefill_token_threshold=24),
        dict(num_gpu_blocks=70, max_num_batched_tokens=32),  # small enough to preempt
    ],
    ids=["plain", "chunked", "preempting"],
)
def test_gemma3_greedy_tokens_and_logits_match_transformers(hf_gemma3, engine_kwargs):
    model, path = hf_gemma3
    llm = LLM(EngineConfig(model=path, block_size=8, **engine_kwargs), record_logits=True)
    assert llm.kv_info.group_windows == (None, WINDOW, WINDOW, WINDOW)  # one full group, three sliding
    for _ in range(2):  # the second round is served from the device prefix cache
        llm.last_logits.clear()
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
        for out, prompt in zip(outs, PROMPTS):
            assert out.token_ids == hf_greedy(model, prompt), len(prompt)
            with torch.no_grad():
                ref_logits = model(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
            torch.testing.assert_close(torch.stack(llm.last_logits[out.request_id]), ref_logits, rtol=1e-4, atol=1e-4)
    stats = llm.stats()
    assert stats["prefix_hit_tokens"]["device"] > 0
    if engine_kwargs["num_gpu_blocks"] == 70:
        assert stats["preemptions"] > 0
    assert llm.kv_cache_manager.block_pool.get_num_free_blocks() == engine_kwargs["num_gpu_blocks"] - 1


def test_gemma3_config_errors_name_the_value(tmp_path, hf_gemma3):
    import json
    import shutil

    _, path = hf_gemma3
    shutil.copytree(path, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["rope_parameters"]["full_attention"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0}
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"RoPE type 'yarn' is not implemented by the bundled engine"):
        LLM(EngineConfig(model=str(tmp_path / "m"), block_size=8, num_gpu_blocks=64))
    cfg["rope_parameters"]["full_attention"] = {"rope_type": "default", "rope_theta": 1e6}
    cfg["layer_types"] = ["sliding_attention", "chunked_attention", "sliding_attention", "full_attention"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"layer_types: 'chunked_attention' is not implemented"):
        LLM(EngineConfig(model=str(tmp_path / "m"), block_size=8, num_gpu_blocks=64))


def test_soft_capping_matches_transformers(tmp_path):
    """tanh soft-capping of the final logits where the config sets it; the attention-score cap
    Gemma 3's config also carries is applied by neither transformers nor the engine."""
    torch.manual_seed(2)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16,
        attn_logit_softcapping=0.5, final_logit_softcapping=2.0, bos_token_id=298, eos_token_id=299, pad_token_id=0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    model = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    llm = LLM(EngineConfig(model=str(tmp_path), block_size=8, num_gpu_blocks=64), record_logits=True)
    prompt = PROMPTS[2][:60]
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))
    with torch.no_grad():
        ref = model(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
    ours = torch.stack(llm.last_logits[out.request_id])
    assert float(ref.abs().max()) <= 2.0  # the final cap is in effect
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert out.token_ids == ref.argmax(-1).tolist()


def test_kvoffload_run_on_a_gemma3_checkpoint(hf_gemma3, tmp_path, capsys):
    """The README's first command on a hybrid checkpoint directory: same tokens with the CPU
    tier, and its prefixes served from it."""
    import json

    from kvoffload.cli import main

    _, path = hf_gemma3
    out = tmp_path / "run.json"
    assert main(["run", "--model", path, "--conversations", "4", "--turns", "2", "--system-tokens", "96",
                 "--user-tokens", "24", "--max-tokens", "4", "--num-gpu-blocks", "24", "--block-size", "8",
                 "--json", str(out)]) == 0
    assert "blocks of the hybrid model's KV-cache groups" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["outputs_identical"] is True
    hits = {k: v for k, v in data["columns"]["offload"].items() if k.startswith("prefix hits")}
    assert any(v for k, v in hits.items() if "cpu" in k), hits
