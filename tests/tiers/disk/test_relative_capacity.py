"""``capacity: 50%`` for a disk tier: a share of the free space (plus what its files hold) where
it keeps them, chosen at start-up and shown; a tier file of nearly that size keeps its size, and
its blocks, across restarts; anything else is refused in one line naming the value."""

from __future__ import annotations

import logging
from collections import namedtuple

import pytest

from kvoffload.config import ConfigError, OffloadConfig, describe
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.tiers.disk import kind as disk_kind

Usage = namedtuple("Usage", "total used free")
MIB = 1 << 20


@pytest.fixture()
def free_space(monkeypatch):
    """The file system reports this much free (a list, so a test can change it)."""
    free = [64 * MIB]
    monkeypatch.setattr(disk_kind.shutil, "disk_usage", lambda p: Usage(1 << 40, 0, free[0]))
    return free


def _config(path, capacity="50%"):
    return {"tiers": [{"medium": "cpu", "capacity": "64KiB"},
                      {"medium": "disk", "path": str(path), "capacity": capacity, "write_through": True}]}


def test_a_share_of_the_free_space_is_chosen_and_shown(tmp_path, free_space):
    cfg = OffloadConfig.from_dict(_config(tmp_path / "kv"))  # the directory does not exist yet
    disk = cfg.tiers[1]
    assert disk.capacity_share == 0.5 and disk.capacity_bytes == 32 * MIB
    assert "32.00 MiB = " in describe(cfg) and "(capacity 50% of the free space there, chosen at start-up)" in describe(cfg)
    free_space[0] = 64 * MIB + 12345  # whole MiB, rounded down
    assert OffloadConfig.from_dict(_config(tmp_path, "12.5%")).tiers[1].capacity_bytes == 8 * MIB


@pytest.mark.parametrize("tier, message", [
    ({"medium": "disk", "capacity": "0%"}, "tiers[1].capacity: '0%'; give a share of the free space in (0%, 100%]"),
    ({"medium": "disk", "capacity": "150%"}, "'150%'; give a share"),
    ({"medium": "disk", "capacity": "half%"}, "'half%'; give a share"),
    ({"medium": "fs", "capacity": "50%"}, "tiers[1].capacity: '50%' is a share of the free disk space, which only a "
                                          "disk tier takes; give a size, e.g. 8GiB"),
])
def test_a_bad_share_is_refused_in_one_line(tmp_path, free_space, tier, message):
    with pytest.raises(ConfigError) as exc:
        OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {**tier, "path": str(tmp_path)}]})
    assert message in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="only a disk tier takes"):
        OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "50%"}]})


def test_a_share_too_small_for_a_mebibyte_names_the_free_space(tmp_path, free_space):
    free_space[0] = 3 * MIB
    with pytest.raises(ConfigError, match=r"tiers\[1\].capacity: 10% of the 3.00 MiB free at .* is less than 1 MiB"):
        OffloadConfig.from_dict(_config(tmp_path, "10%"))


PROMPTS = [[(i * 29 + j) % 250 + 1 for j in range(64)] for i in range(6)]


def _restart(path, caplog) -> tuple[int, list[str]]:
    """One engine's life on the tier: blocks recovered at its start, its disk tier's log lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvoffload"), \
            LLM(EngineConfig(block_size=8, num_gpu_blocks=64, kv_offload=_config(path))) as llm:
        llm.generate(PROMPTS, SamplingParams(max_tokens=2))
        recovered = llm.stats()["connector"]["tier_blocks_recovered"]["disk"]
    return recovered, [r.getMessage() for r in caplog.records]


def test_a_tier_file_keeps_its_size_and_blocks_while_the_share_moves_a_little(tmp_path, free_space, caplog):
    first, lines = _restart(tmp_path, caplog)
    assert first == 0 and any("capacity 32.00 MiB (50% of the free space there)" in line for line in lines)
    free_space[0] = 60 * MIB  # the file system filled a little: the share is 30 MiB, within 10%
    second, lines = _restart(tmp_path, caplog)
    assert second > 0  # the blocks written through, recovered
    assert any("capacity 32.00 MiB" in line for line in lines)  # the file's size, kept
    free_space[0] = 20 * MIB  # much less: a new size (the old one would not fit), the tier starts empty
    third, lines = _restart(tmp_path, caplog)
    assert third == 0 and any("capacity 10.00 MiB" in line for line in lines)
    assert any("written with another layout" in line for line in lines)
