"""The fs tier's keys are validated like every other key: one line naming the key, the value
and the fix; ``kvoffload config check`` checks the directories."""

from __future__ import annotations

import os

import pytest

from kvoffload.cli import main
from kvoffload.config import ConfigError, OffloadConfig


def _config(*tiers):
    return OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB"}, *tiers]})


def test_defaults_one_directory_and_several(tmp_path):
    tier = _config({"medium": "fs", "path": str(tmp_path), "capacity": "1GiB"}).tiers[1]
    assert tier.write_through and tier.path == str(tmp_path) and tier.options.paths == ()
    assert tier.options.max_store_ms_per_mib == 20.0 and tier.options.retry_after_s == 10.0
    assert tier.options.io_threads == 4
    two = _config({"medium": "fs", "paths": ["/a", "/b"], "capacity": "1GiB", "max_store_ms_per_mib": 5,
                   "write_through": False}).tiers[1]
    assert two.options.paths == ("/a", "/b") and two.options.max_store_ms_per_mib == 5.0 and not two.write_through


@pytest.mark.parametrize("change, match", [
    ({"path": None}, r"tiers\[1\]\.path: required for medium fs; give the shared cache directory"),
    ({"paths": ["/a", "/b"]}, r"tiers\[1\]: both path and paths given"),
    ({"path": None, "paths": "/a"}, r"tiers\[1\]\.paths: '/a'; give a list of directories"),
    ({"path": None, "paths": ["/a", ""]}, r"tiers\[1\]\.paths: "),
    ({"path": None, "paths": ["/a", "/a"]}, r"tiers\[1\]\.paths: \['/a', '/a'\] names a directory twice"),
    ({"max_store_ms_per_mib": 0}, r"tiers\[1\]\.max_store_ms_per_mib: 0; give a number above 0"),
    ({"max_store_ms_per_mib": "fast"}, r"tiers\[1\]\.max_store_ms_per_mib: 'fast'"),
    ({"retry_after_s": True}, r"tiers\[1\]\.retry_after_s: True"),
    ({"io_threads": 0}, r"tiers\[1\]\.io_threads: 0; give a whole number from 1 to 64"),
    ({"capacity": None}, r"tiers\[1\]\.capacity: required"),
    ({"stripe": 4}, r"tiers\[1\]\.stripe: unknown key; allowed keys here: .*paths"),
    ({"eviction_policy": "arc"}, r"tiers\[1\]\.eviction_policy: 'arc'; the fs tier evicts least recently used"),
])
def test_bad_values_name_the_key_and_the_fix(change, match):
    tier = {"medium": "fs", "path": "/tmp/kv", "capacity": "1GiB", **change}
    tier = {k: v for k, v in tier.items() if v is not None}
    with pytest.raises(ConfigError, match=match):
        _config(tier)


def test_fs_is_the_last_tier(tmp_path):
    with pytest.raises(ConfigError, match=r"tiers\[2\]: a tier after the fs tier; fs must be the last tier"):
        _config({"medium": "fs", "path": str(tmp_path), "capacity": "1GiB"},
                {"medium": "disk", "path": str(tmp_path / "d"), "capacity": "1GiB"})
    ok = _config({"medium": "disk", "path": str(tmp_path / "d"), "capacity": "1GiB"},
                 {"medium": "fs", "path": str(tmp_path / "f"), "capacity": "1GiB"})
    assert [t.medium for t in ok.tiers] == ["cpu", "disk", "fs"]


def test_config_check_reports_an_unwritable_directory(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(f"tiers:\n  - {{medium: cpu, capacity: 1MiB}}\n  - {{medium: fs, path: {tmp_path / 'kv'}, "
                    "capacity: 1MiB}\n")
    assert main(["config", "check", str(good)]) == 0
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"tiers:\n  - {{medium: cpu, capacity: 1MiB}}\n  - {{medium: fs, path: {blocked / 'kv'}, "
                   "capacity: 1MiB}\n")
    assert main(["config", "check", str(bad)]) != 0
    assert "tiers[1].path" in capsys.readouterr().err


def test_config_check_looks_at_every_directory_of_paths(tmp_path, capsys):
    """A first directory short of space is a warning; an unwritable second one is still an error."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    cfg = tmp_path / "paths.yaml"
    cfg.write_text(f"tiers:\n  - {{medium: cpu, capacity: 1MiB}}\n  - {{medium: fs, capacity: 64000TiB, "
                   f"paths: [{tmp_path / 'a'}, {blocked / 'b'}]}}\n")
    assert main(["config", "check", str(cfg)]) != 0
    assert f"{blocked / 'b'}" in capsys.readouterr().err


def test_a_process_with_another_capacity_on_a_shared_directory_is_warned(tmp_path, caplog):
    import logging

    from kvoffload.tiers.fs.directory import FsDirectory

    FsDirectory(tmp_path, 1 << 20, 4096 + 64, "tiers[1].path")  # the first process fixes the description
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        FsDirectory(tmp_path, 1 << 20, 4096 + 64, "tiers[1].path")
        assert not caplog.records  # the same capacity: nothing to say
        second = FsDirectory(tmp_path, 4 << 20, 4096 + 64, "tiers[1].path")
    (record,) = caplog.records
    assert "created with capacity 1.00 MiB, this process bounds it at 4.00 MiB" in record.getMessage()
    assert "give every process sharing it the same capacity" in record.getMessage()
    assert len(second.buckets) == len(FsDirectory(tmp_path, 1 << 20, 4096 + 64, "x").buckets)  # the first's buckets


@pytest.mark.parametrize("medium", ["fs", "disk"])
@pytest.mark.parametrize("written", ["$KV_SHARED/cache", "${KV_SHARED}/cache"])
def test_an_unset_variable_in_a_path_is_refused_by_name(tmp_path, capsys, monkeypatch, medium, written):
    """Expanded to nothing or kept literally, it would open a directory of its own on each
    replica (a literal '$KV_SHARED/cache' under the working directory): replicas would not share."""
    monkeypatch.delenv("KV_SHARED", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.path: .*cache' uses \$KV_SHARED, which is not set; set "
                                          r"KV_SHARED in the engine's environment"):
        _config({"medium": medium, "path": written, "capacity": "1MiB"})
    if medium == "fs":
        with pytest.raises(ConfigError, match=r"tiers\[1\]\.paths: .* uses \$KV_SHARED, which is not set"):
            _config({"medium": "fs", "paths": [str(tmp_path / "a"), written], "capacity": "1MiB"})
    cfg = tmp_path / "tiers.yaml"
    cfg.write_text(f"tiers:\n  - {{medium: cpu, capacity: 1MiB}}\n  - {{medium: {medium}, path: '{written}', "
                   "capacity: 1MiB}\n")
    assert main(["config", "check", str(cfg)]) != 0
    assert "KV_SHARED" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["tiers.yaml"]  # nothing created
    monkeypatch.setenv("KV_SHARED", str(tmp_path / "shared"))
    assert _config({"medium": medium, "path": written, "capacity": "1MiB"}).tiers[1].path == str(tmp_path / "shared/cache")


@pytest.mark.parametrize("second, how", [("{d}/", "are one directory"), ("{d}/./", "are one directory"),
                                         ("{link}", "are one directory"), ("{d}/sub", "lie one inside the other")])
def test_one_directory_named_twice_in_paths_is_refused(tmp_path, second, how):
    d = tmp_path / "kv"
    d.mkdir()
    (tmp_path / "link").symlink_to(d)
    other = second.format(d=d, link=tmp_path / "link")
    with pytest.raises(ConfigError, match=rf"tiers\[1\]\.paths: '{d}' and '{other}' {how} .*list each directory once"):
        _config({"medium": "fs", "paths": [str(d), other], "capacity": "1MiB"})
    ok = _config({"medium": "fs", "paths": [str(d), str(tmp_path / "kv2")], "capacity": "2MiB"})
    from kvoffload.tiers.fs.kind import tier_roots

    assert tier_roots(ok.tiers[1], "tiers[1]") == [str(d), str(tmp_path / "kv2")]


def test_a_shared_directory_whose_parent_is_absent_is_refused_not_created(tmp_path, capsys, monkeypatch):
    """An fs tier at /mnt/shared/kvcache with /mnt/shared absent (an unmounted share) used to pass
    `config check`, and the engine created the whole path on the local disk: replicas would each
    cache "shared" KV alone. The leaf is created only inside an existing directory."""
    import json

    from kvoffload import cli
    from kvoffload.engine import LLM, EngineConfig

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # tmp_path is not the user's: no parents made there
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path / "home" / "cache"))
    missing = tmp_path / "mnt" / "shared" / "kvcache"
    cfg = {"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {"medium": "fs", "path": str(missing), "capacity": "8MiB"}]}
    path = tmp_path / "tiers.yaml"
    path.write_text(json.dumps(cfg))
    assert cli.main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "does not exist and neither does its parent: is the shared file system mounted?" in err
    with pytest.raises(ConfigError, match="is the shared file system mounted"):
        LLM(EngineConfig(num_gpu_blocks=32, kv_offload=cfg))
    assert not (tmp_path / "mnt").exists()
    leaf = {**cfg["tiers"][1], "path": str(tmp_path / "kvcache")}  # its parent exists: the leaf is made
    with LLM(EngineConfig(num_gpu_blocks=32, kv_offload={"tiers": [cfg["tiers"][0], leaf]})):
        assert (tmp_path / "kvcache").is_dir()
    private = {**leaf, "path": str(tmp_path / "home" / ".cache" / "kvoffload" / "shared")}  # the demo's: made whole
    with LLM(EngineConfig(num_gpu_blocks=32, kv_offload={"tiers": [cfg["tiers"][0], private]})):
        assert (tmp_path / "home" / ".cache" / "kvoffload" / "shared").is_dir()
