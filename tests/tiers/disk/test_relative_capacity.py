"""``capacity: 50%`` for a disk tier: a share of the free space (plus what its own files hold) where
it keeps them, chosen at start-up and shown; a tier file of nearly that size keeps its size, and
its blocks, across restarts; at another size it keeps the blocks that fit and says so; anything
else is refused in one line naming the value."""

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
    ({"medium": "disk", "capacity": "1_0%"}, "'1_0%'; give a share"),
    ({"medium": "disk", "capacity": "\uff15\uff10%"}, "give a share of the free space"),
    ({"medium": "disk", "capacity": "\u0665\u0660%"}, "give a share of the free space"),
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
    free_space[0] = 20 * MIB  # much less: a new size (the old one would not fit); the blocks that fit stay
    third, lines = _restart(tmp_path, caplog)
    assert any("capacity 10.00 MiB" in line for line in lines)
    resized = [line for line in lines if "capacity 32.00 MiB -> 10.00 MiB (50% of the free space, which fell)" in line]
    assert len(resized) == 1 and f"{third:,} blocks kept, 0 dropped" in resized[0], lines
    assert third >= second > 0  # every record sat in the first slots: none was past the new end
    assert not any("written with another layout" in line for line in lines)


def _restart_sized(path, caplog, capacity: str) -> tuple[int, list[str]]:
    caplog.clear()
    cfg = _config(path, capacity)
    with caplog.at_level(logging.INFO, logger="kvoffload"), \
            LLM(EngineConfig(block_size=8, num_gpu_blocks=64, kv_offload=cfg)) as llm:
        recovered = llm.stats()["connector"]["tier_blocks_recovered"]["disk"]
        llm.generate(PROMPTS, SamplingParams(max_tokens=2))
    return recovered, [r.getMessage() for r in caplog.records]


def test_a_smaller_capacity_keeps_the_blocks_that_fit_and_counts_the_rest(tmp_path, caplog):
    """A new capacity used to empty the tier, blaming "another layout or version"."""
    # 62 slots of 4 KiB and their 64-byte headers after the file's 4 KiB header: the file, 255.88
    # KiB, stays within the capacity. Each run stores some blocks.
    _restart_sized(tmp_path, caplog, "256KiB")
    _restart_sized(tmp_path, caplog, "256KiB")
    held, _ = _restart_sized(tmp_path, caplog, "256KiB")
    assert 14 < held <= 62  # slots are taken lowest first: they sit in slots 0 .. held - 1
    recovered, lines = _restart_sized(tmp_path, caplog, "64KiB")  # 14 slots: a 60.88 KiB file
    resized = [line for line in lines if "capacity 255.88 KiB -> 60.88 KiB:" in line]
    assert len(resized) == 1 and f"14 blocks kept, {held - 14} dropped (slots past the new end)" in resized[0], lines
    assert recovered == 14
    recovered, lines = _restart_sized(tmp_path, caplog, "256KiB")  # and back: those 14 are still there
    assert recovered >= 14 and any("60.88 KiB -> 255.88 KiB" in line for line in lines)


def test_another_models_tier_file_is_not_counted_as_this_tiers_space(tmp_path, free_space, caplog):
    """The share counted every ``*.kvdata`` in the directory as space the tier may reuse; another
    model's file is never freed by this tier, so only this tier's own files count."""
    (tmp_path / "kvoffload-0123456789abcdef-8192.kvdata").write_bytes(b"\1" * (40 * MIB))  # 40 MiB, allocated
    _, lines = _restart(tmp_path, caplog)
    assert any("capacity 32.00 MiB (50% of the free space there)" in line for line in lines), lines
