"""A disk tier's ``capacity`` bounds its file, headers included: a 200 GiB tier used to make a
201.56 GiB file (its record headers came on top), past what the operator gave it."""

from __future__ import annotations

import os

import pytest

from kvoffload.config import OffloadConfig
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.tiers.disk.format import HEADER_BYTES, RECORD_HEADER


@pytest.mark.parametrize("capacity", ["1MiB", "1000KiB", "257KiB"])
def test_the_tier_file_is_never_larger_than_its_capacity(tmp_path, capacity):
    config = {"tiers": [{"medium": "cpu", "capacity": "64KiB"},
                        {"medium": "disk", "path": str(tmp_path), "capacity": capacity, "write_through": True}]}
    cap = OffloadConfig.from_dict(config).tiers[1].capacity_bytes
    with LLM(EngineConfig(model="tiny", num_gpu_blocks=16, kv_offload=config)) as llm:
        llm.generate([list(range(1, 100))], SamplingParams(max_tokens=4))
        block_bytes = llm.kv_info.block_bytes
        slots = llm.stats()["connector"]["tier_usage"]["disk"][1]
    files = [p for p in tmp_path.iterdir() if p.suffix == ".kvdata"]
    assert len(files) == 1
    size = os.path.getsize(files[0])
    assert size <= cap
    assert slots == (cap - HEADER_BYTES) // (RECORD_HEADER + block_bytes)  # as many as fit, and no more
    assert size == HEADER_BYTES + slots * (RECORD_HEADER + block_bytes)
    assert cap - size < RECORD_HEADER + block_bytes  # no record's room left unused


def test_config_check_counts_the_blocks_the_file_will_hold(tmp_path):
    cfg = OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                                             {"medium": "disk", "path": str(tmp_path), "capacity": "1MiB"}]})
    assert cfg.tier_blocks(8192) == [128, (2**20 - HEADER_BYTES) // (RECORD_HEADER + 8192)]
    # Under tensor parallelism each rank keeps its own file, headers and all.
    assert cfg.tier_blocks(2 * 8192, world_size=2) == [64, (2**20 - 2 * HEADER_BYTES) // (2 * RECORD_HEADER + 2 * 8192)]
