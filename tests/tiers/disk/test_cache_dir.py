"""A disk tier without a path lives in the per-user cache directory, created with its parents
(a fresh HOME has no ~/.cache); explicit paths keep the parent-must-exist rule."""

from __future__ import annotations

import os
import stat

import pytest

from kvoffload.config import OffloadConfig, default_cache_dir
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.llm import LLM
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.errors import ConfigError
from kvoffload.examples import resolve_config

TIERS = {"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {"medium": "disk", "capacity": "4MiB"}]}


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("KVOFFLOAD_CACHE_DIR", raising=False)
    return tmp_path / "home"


def test_default_cache_dir_follows_the_environment(fresh_home, monkeypatch):
    assert default_cache_dir() == fresh_home / ".cache" / "kvoffload"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: relative values are invalid
    assert default_cache_dir() == fresh_home / ".cache" / "kvoffload"
    monkeypatch.setenv("XDG_CACHE_HOME", str(fresh_home / "xdg"))
    assert default_cache_dir() == fresh_home / "xdg" / "kvoffload"
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", "~/kv")
    assert default_cache_dir() == fresh_home / "kv"


def test_the_cpu_disk_example_runs_on_a_fresh_home(fresh_home):
    cfg = OffloadConfig.from_yaml(resolve_config("cpu_disk"))
    assert cfg.tiers[1].path == str(fresh_home / ".cache" / "kvoffload")
    assert not (fresh_home / ".cache").exists()
    prompts = [[(i * 37 + j) % 250 + 1 for j in range(400)] for i in range(12)]  # 300 blocks: past the CPU tier's 64
    llm = LLM(EngineConfig(model="small", num_gpu_blocks=64, kv_offload=cfg))
    first = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=4))]
    llm.close()
    cache = fresh_home / ".cache" / "kvoffload"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert [p.name for p in cache.iterdir() if p.suffix == ".kvdata"]  # the tier's file is there
    again = LLM(EngineConfig(model="small", num_gpu_blocks=64, kv_offload=cfg))  # a restart recovers it
    out = [o.token_ids for o in again.generate(prompts, SamplingParams(max_tokens=4))]
    assert out == first and again.stats()["prefix_hit_tokens"]["disk"] > 0
    again.close()


def test_env_vars_expand_and_explicit_paths_still_need_their_parent(tmp_path, monkeypatch):
    monkeypatch.setenv("KVO_TEST_ROOT", str(tmp_path))
    raw = {"tiers": [TIERS["tiers"][0], {"medium": "disk", "capacity": "4MiB", "path": "$KVO_TEST_ROOT/kv"}]}
    assert OffloadConfig.from_dict(raw).tiers[1].path == str(tmp_path / "kv")
    raw["tiers"][1]["path"] = str(tmp_path / "missing" / "kv")
    with pytest.raises(ConfigError, match="neither does its parent"):
        LLM(EngineConfig(num_gpu_blocks=32, kv_offload=raw))
    raw["tiers"][1]["path"] = ""
    with pytest.raises(ConfigError, match="leave path out for the default"):
        OffloadConfig.from_dict(raw)
    assert not os.path.exists(tmp_path / "missing")
