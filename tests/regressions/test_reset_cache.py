"""Weights updated in place, then the cache reset (vLLM: ``reset_prefix_cache(reset_connector=
True)``, what ``pause_generation(clear_cache=True)`` does): no tier may serve KV of the old
weights afterwards, and a restarted engine never serves KV computed after the reset."""

import torch

from kvoffload.engine import LLM, EngineConfig, SamplingParams

PROMPTS = [[(i * 13 + j * 5) % 250 + 1 for j in range(80)] for i in range(3)]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def tiers(path):
    return {"tiers": [{"medium": "cpu", "capacity": "4MiB"},
                      {"medium": "disk", "path": str(path), "capacity": "16MiB", "write_through": True}]}


def engine(path=None):
    return LLM(EngineConfig(num_gpu_blocks=64, kv_offload=tiers(path) if path is not None else None))


def new_weights(llm):
    """An in-place weight update, as an RL trainer or ``reload_weights`` does."""
    with torch.no_grad():
        for p in llm.runner.model.parameters():
            p.add_(0.05 * torch.cos(torch.arange(p.numel(), dtype=p.dtype)).reshape(p.shape))


def tokens(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


def offload_hits(llm):
    hits = llm.stats()["prefix_hit_tokens"]
    return hits["cpu"] + hits["disk"]


def test_reset_after_new_weights_serves_nothing_old(tmp_path):
    with engine() as ref:
        old = tokens(ref)
    with engine() as ref:
        new_weights(ref)
        new = tokens(ref)
    assert new != old
    with engine(tmp_path) as llm:
        assert tokens(llm) == old
        new_weights(llm)
        assert llm.reset_prefix_cache(reset_connector=True)
        assert tokens(llm) == new and offload_hits(llm) == 0
        llm.reset_prefix_cache()
        assert tokens(llm) == new and offload_hits(llm) > 0  # what is stored after the reset is served
    # A restart loads the original weights: it may serve what they computed before the reset,
    # never what the updated weights computed after it.
    with engine(tmp_path) as llm:
        assert tokens(llm) == old and offload_hits(llm) > 0


def test_negative_control_without_the_connector_reset_old_kv_is_served(tmp_path):
    with engine() as ref:
        new_weights(ref)
        new = tokens(ref)
    with engine(tmp_path) as llm:
        tokens(llm)
        new_weights(llm)
        llm.reset_prefix_cache()
        assert tokens(llm) != new and offload_hits(llm) > 0
