"""A disk cache is reused only by the model that wrote it: new weights in the same checkpoint
directory, or a config change that changes the KV, start a new namespace and say why."""

import json
import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvoffload.engine import LLM, EngineConfig, SamplingParams  # noqa: E402
from kvoffload.namespace import KVNamespace  # noqa: E402

PROMPTS = [[(i * 11 + j * 7) % 290 + 1 for j in range(70)] for i in range(3)]


def save_model(path, seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=298, eos_token_id=299, **overrides)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)


def generate(model_dir, cache_dir=None):
    offload = None
    if cache_dir is not None:
        offload = {"tiers": [{"medium": "cpu", "capacity": "4MiB"},
                             {"medium": "disk", "path": str(cache_dir), "capacity": "16MiB", "write_through": True}]}
    with LLM(EngineConfig(model=str(model_dir), block_size=8, num_gpu_blocks=64, kv_offload=offload)) as llm:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
        return [o.token_ids for o in outs], llm.stats()


def test_same_model_reuses_the_cache(tmp_path):
    save_model(tmp_path / "m")
    expected, _ = generate(tmp_path / "m")
    generate(tmp_path / "m", tmp_path / "cache")
    tokens, stats = generate(tmp_path / "m", tmp_path / "cache")
    assert tokens == expected and stats["prefix_hit_tokens"]["disk"] > 0


@pytest.mark.parametrize("change", ["fine-tune", "rope_theta"])
def test_a_changed_model_under_the_same_path_is_never_served_old_kv(tmp_path, caplog, change):
    model = tmp_path / "m"
    save_model(model)
    generate(model, tmp_path / "cache")
    if change == "fine-tune":  # new weights, same directory, same shapes and config
        save_model(model, seed=1)
    else:  # the same weights with another RoPE base
        cfg = json.loads((model / "config.json").read_text())
        cfg["rope_parameters"]["rope_theta"] = 50_000.0
        (model / "config.json").write_text(json.dumps(cfg))
    expected, _ = generate(model)
    with caplog.at_level(logging.INFO, logger="kvoffload"):
        tokens, stats = generate(model, tmp_path / "cache")
    assert tokens == expected
    assert stats["prefix_hit_tokens"]["disk"] == 0 and stats["connector"]["tier_blocks_recovered"]["disk"] == 0
    changed = "weights" if change == "fine-tune" else "model"
    reasons = [r.getMessage() for r in caplog.records if "not reusing the cache of namespace" in r.getMessage()]
    assert len(reasons) == 1 and f"({changed} differ)" in reasons[0]
    opened = [r.getMessage() for r in caplog.records if "recovered 0 blocks" in r.getMessage()]
    assert len(opened) == 1 and "namespace " in opened[0]


def test_namespace_digest_covers_every_component():
    base = {"weights": "w", "model": "m", "dtype": "float32", "kv_dtype": "float32", "geometry": "16t", "hash": "h"}
    digest = KVNamespace.of(base).digest
    for key in base:
        assert KVNamespace.of({**base, key: "other"}).digest != digest, key
    assert KVNamespace.of(dict(base)).digest == digest
    assert KVNamespace.of(base).differences({**KVNamespace.of(base).as_dict(), "weights": "x"}) == ["weights"]


def test_the_label_names_the_model_for_people_and_is_not_part_of_the_digest():
    """A checkpoint moved to another path is the same KV: its label changes, its digest does not."""
    parts = {"weights": "checkpoint:abc", "model": "m1", "dtype": "float16"}
    here, moved = KVNamespace.of(parts, label="/models/a"), KVNamespace.of(parts, label="/mnt/models/a")
    assert here.digest == moved.digest and here.differences(moved.as_dict()) == []
    assert "label" not in here.as_dict() and here.label == "/models/a"
