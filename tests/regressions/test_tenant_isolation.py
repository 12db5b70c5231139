"""cache_salt separates tenants in every tier: identical prompts with different salts never hit
each other's blocks (the hit counters say 0), the same salt does, also after a restart."""

import pytest

from kvoffload.engine import LLM, EngineConfig, SamplingParams
from tests.tiers.mooncake.conftest import MISSING

PROMPTS = [[(i * 17 + j * 3) % 250 + 1 for j in range(96)] for i in range(3)]
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def tiers(kind, tmp_path, master=None):
    """``never-recompute``: these tests count a tenant's hits, so every hit is loaded; under
    ``auto`` a busy machine's slow store read can be given up for recomputing (correct, but
    then a hit fewer: a CI run beside other jobs counted 192 of 288); and no store is skipped
    for running late (``max_store_ms_per_mib``)."""
    cpu = {"medium": "cpu", "capacity": "4MiB"}
    if kind == "cpu":
        return {"tiers": [cpu]}
    if kind == "disk":
        return {"tiers": [cpu, {"medium": "disk", "path": str(tmp_path), "capacity": "16MiB", "write_through": True,
                                "load_mode": "never-recompute", "max_store_ms_per_mib": 60000}]}
    return {"tiers": [cpu, master.tier(segment=0, local_buffer="16MiB", load_mode="never-recompute")]}


def offload_hits(llm) -> int:
    hits = llm.stats()["prefix_hit_tokens"]
    return sum(v for k, v in hits.items() if k != "device")


def round_(llm, salt):
    """One round after a device reset: every hit comes from the offload tiers."""
    llm.reset_prefix_cache()
    before = offload_hits(llm)
    tokens = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, cache_salt=salt)]
    return tokens, offload_hits(llm) - before


def check_isolation(kv):
    with LLM(EngineConfig(num_gpu_blocks=64, kv_offload=kv)) as llm:
        tokens_a, hits = round_(llm, "tenant-a")
        assert hits == 0
        tokens_b, hits = round_(llm, "tenant-b")
        assert hits == 0 and tokens_b == tokens_a  # same model, same prompts: same tokens, computed anew
        _, hits = round_(llm, None)
        assert hits == 0  # no salt is a tenant of its own
        _, hits = round_(llm, "tenant-a")
        assert hits == 3 * 96  # ... and the same salt hits all of its blocks


@pytest.mark.parametrize("kind", ["cpu", "disk"])
def test_salts_separate_tenants(tmp_path, kind):
    check_isolation(tiers(kind, tmp_path))


def test_salts_separate_tenants_across_a_restart(tmp_path):
    kv = tiers("disk", tmp_path)
    with LLM(EngineConfig(num_gpu_blocks=64, kv_offload=kv)) as llm:
        round_(llm, "tenant-a")
    with LLM(EngineConfig(num_gpu_blocks=64, kv_offload=kv)) as llm:
        assert round_(llm, "tenant-b")[1] == 0
        assert round_(llm, "tenant-a")[1] == 3 * 96


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_salts_separate_tenants_in_a_shared_store(tmp_path):
    from kvoffload.testing.mooncake_master import MooncakeMaster

    with MooncakeMaster(str(tmp_path)) as master:
        master.segment_holder("128MB")
        kv = tiers("mooncake", tmp_path, master)
        check_isolation(kv)
        with LLM(EngineConfig(num_gpu_blocks=64, kv_offload={"tiers": [{"medium": "cpu", "capacity": "64KiB"},
                                                                      kv["tiers"][1]]})) as replica:
            assert round_(replica, "tenant-c")[1] == 0  # a tenant nobody served yet
            assert round_(replica, "tenant-a")[1] == 3 * 96  # from the store: another replica's tenant-a blocks
