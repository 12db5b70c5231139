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


def test_a_connector_reset_beside_a_failed_device_reset_stores_nothing_older(tmp_path):
    """vLLM resets the connector even when its device reset fails (a request holds blocks): the
    device prefix cache keeps the old weights' KV, and a request that hits it (and everything it
    computes on top) must not be stored under the new salt, where later requests would load it."""
    with engine() as ref:
        new_weights(ref)
        new = tokens(ref)
    extended = [p + [7, 8, 9] * 11 for p in PROMPTS]  # the prompts' blocks, then more on top
    with engine(tmp_path) as llm:
        tokens(llm)  # the old weights' KV: in the device prefix cache and the tiers
        new_weights(llm)
        busy = llm.add_request([5] * 40, SamplingParams(max_tokens=50, ignore_eos=True))
        llm.step()
        assert llm.reset_prefix_cache(reset_connector=True) is False  # the device reset failed
        stale = llm.generate(extended, PARAMS)  # device hits on the old weights' blocks
        assert sum(o.num_cached_tokens for o in stale) > 0
        while llm.scheduler.has_unfinished_requests():
            llm.step()
        assert len(llm.collect(busy).token_ids) == 50
        assert llm.reset_prefix_cache()  # the device cache is clear now; the tiers are what is left
        before = offload_hits(llm)
        assert tokens(llm) == new  # never the stale blocks the extended prompts ran on
        assert offload_hits(llm) == before  # nothing of them was stored under the new salt
