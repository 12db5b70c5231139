from pathlib import Path

import pytest
import yaml

from kvoffload.config import ConfigError, OffloadConfig, parse_size
from kvoffload.offload import CPUOffloadingManager, EngineKVInfo, FilterReusedOffloadingManager, OffloadingSpecFactory
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.tiers.tiered_spec import TieredOffloadingSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def cpu(**kw):
    tier = {"name": "cpu", "medium": "cpu", "capacity": "1MiB"}
    tier.update(kw)
    return {"tiers": [tier]}


@pytest.mark.parametrize(
    "text, expected",
    [("512MiB", 512 << 20), ("8GiB", 8 << 30), ("1.5GB", 1_500_000_000), (4096, 4096), ("2 KiB", 2048), ("3kb", 3000)],
)
def test_sizes(text, expected):
    assert parse_size(text, "k") == expected


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "bogus": 1}, "bogus: unknown key"),
        (cpu(colour="red"), r"tiers\[0\].colour: unknown key"),
        (cpu(capacity="12 parsecs"), r"tiers\[0\].capacity: cannot parse"),
        (cpu(capacity=-5), r"tiers\[0\].capacity: size must be positive"),
        (cpu(capacity=0), r"tiers\[0\].capacity: size must be positive"),
        (cpu(eviction_policy="mru"), r"tiers\[0\].eviction_policy: unknown eviction policy 'mru'; known: arc, .*lru"),
        ({"tiers": [{"name": "a", "medium": "cpu", "capacity": 10}, {"name": "a", "medium": "disk", "capacity": 10, "path": "/tmp"}]},
         r"tiers\[1\].name: duplicate tier name 'a'"),
        ({"tiers": [{"medium": "tape", "capacity": 10}]}, r"tiers\[0\].medium: 'tape'"),
        ({"tiers": [{"medium": "cpu", "capacity": 10}, {"medium": "disk", "capacity": 10, "path": ""}]},
         r"tiers\[1\].path: ''; give a directory, or leave path out"),
        ({"tiers": []}, "tiers: must be a non-empty list"),
        ({}, "tiers: required"),
        ({**cpu(), "store_threshold": -1}, "store_threshold: -1"),
        ({**cpu(), "offloaded_block_size": 0}, "offloaded_block_size: 0"),
        ({**cpu(), "transfer": {"backend": "gpu"}}, "transfer.backend: 'gpu'"),
        ({**cpu(), "transfer": {"num_streams": 0}}, "transfer.num_streams: 0"),
        ({**cpu(), "metrics": {"prometheus_port": 70000}}, "metrics.prometheus_port: 70000"),
        ({**cpu(), "metrics": {"colour": 1}}, "metrics.colour: unknown key"),
        ({**cpu(), "transfer": []}, r"transfer: \[\] must be a mapping"),
        ({**cpu(), "metrics": "on"}, "metrics: 'on' must be a mapping"),
        ({**cpu(), "auth": "hunter2"}, "auth: 'hunter2' must be a mapping"),
        ({**cpu(), "load_mode": "layerwize"}, "load_mode: 'layerwize' is not a load mode; use one of auto, layerwise, async"),
        (cpu(load_mode=3), r"tiers\[0\].load_mode: 3 is not a load mode"),
    ],
)
def test_invalid_configs_name_the_key(raw, key):
    with pytest.raises(ConfigError, match=key):
        OffloadConfig.from_dict(raw)


def test_non_multiple_block_size_and_tiny_capacity():
    cfg = OffloadConfig.from_dict({**cpu(capacity=1000), "offloaded_block_size": 24})
    with pytest.raises(ConfigError, match="offloaded_block_size: 24 is not a multiple of the engine block size 16"):
        cfg.block_size_factor(16)
    assert OffloadConfig.from_dict({**cpu(), "offloaded_block_size": 64}).block_size_factor(16) == 4
    with pytest.raises(ConfigError, match=r"tiers\[0\].capacity: 1000 bytes is smaller than one offloaded block"):
        OffloadConfig.from_dict(cpu(capacity=1000)).tier_blocks(8192)


def test_yaml_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers:\n  - medium: cpu\n    capacity: 8 bananas\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: tiers\[0\].capacity"):
        OffloadConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read config file"):
        OffloadConfig.from_yaml(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", ["cpu.yaml", "cpu_disk.yaml", "research_arc.yaml"])
def test_examples_load(name):
    cfg = OffloadConfig.from_yaml(EXAMPLES / name)
    assert cfg.tiers[0].medium == "cpu"


def test_spec_builds_manager_from_config():
    cfg = OffloadConfig.from_dict({**cpu(capacity="64KiB", eviction_policy="arc"), "offloaded_block_size": 32})
    spec = OffloadingSpecFactory.create_spec(cfg, EngineKVInfo(block_size=16, block_bytes=1024))
    assert spec.block_size_factor == 2 and spec.offloaded_block_bytes == 2048
    mgr = spec.get_manager()
    assert isinstance(mgr, HostTierChain) and not mgr.secondaries  # a chain of one
    assert isinstance(mgr.primary, CPUOffloadingManager) and mgr.primary.num_blocks == 32 and mgr.block_size == 32
    filtered = OffloadingSpecFactory.create_spec(
        OffloadConfig.from_dict({**cpu(), "store_threshold": 2}), EngineKVInfo(16, 1024)).get_manager()
    assert isinstance(filtered, FilterReusedOffloadingManager)
    with pytest.raises(ConfigError, match="unknown spec 'Nope'"):
        OffloadingSpecFactory.create_spec(OffloadConfig.from_dict({**cpu(), "spec_name": "Nope"}), EngineKVInfo(16, 1024))
    # The spec's name before it said it builds the whole chain: configs naming it still work.
    old = OffloadingSpecFactory.create_spec(OffloadConfig.from_dict({**cpu(), "spec_name": "CPUOffloadingSpec"}),
                                            EngineKVInfo(16, 1024))
    assert type(old) is TieredOffloadingSpec


def test_load_mode_per_tier_overrides_the_top_level(tmp_path, capsys):
    from kvoffload.cli import main

    raw = {"load_mode": "async", "tiers": [{"medium": "cpu", "capacity": "1MiB"},
                                           {"medium": "disk", "capacity": "1MiB", "path": str(tmp_path),
                                            "load_mode": "auto"}]}
    cfg = OffloadConfig.from_dict(raw)
    assert cfg.tier_load_modes() == {"CPU": "async", "DISK": "auto"}
    assert OffloadConfig.from_dict(cpu()).tier_load_modes() == {"CPU": "auto"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "load mode: async" in out and "load mode auto" in out
    path.write_text(yaml.safe_dump({**raw, "load_mode": "fast"}))
    assert main(["config", "check", str(path)]) == 2
    assert "load_mode: 'fast' is not a load mode; use one of auto, layerwise, async, never-recompute" in capsys.readouterr().err


def test_config_check_cli(capsys):
    from kvoffload.cli import main

    assert main(["config", "check", str(EXAMPLES / "cpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "blocks" in out and "policy lru" in out
