"""``kvoffload cache ls | verify | clear`` on disk tiers written by real engine runs: what is
listed, what a flipped byte does to verify, and that nothing an engine holds is removed."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from kvoffload.cli import main
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.llm import LLM
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.tiers.disk.format import RECORD_HEADER, parse_file_header

PROMPTS = [[(i * 37 + j) % 250 + 1 for j in range(160)] for i in range(6)]


#: These tests count the records a run leaves: no store may be skipped because a busy machine
#: (CI running tests two at a time beside installs) made it run late.
PATIENT = {"max_store_ms_per_mib": 60000}


def _config(tmp_path, auth_env: str | None = None):
    cfg = {"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                     {"medium": "disk", "capacity": "4MiB", "path": str(tmp_path / "cache"), "write_through": True,
                      **PATIENT}]}
    if auth_env:
        cfg["auth"] = {"secret_env": auth_env}
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _fill(cfg_path) -> LLM:
    llm = LLM(EngineConfig(num_gpu_blocks=48, kv_offload=str(cfg_path)))
    llm.generate(PROMPTS, SamplingParams(max_tokens=2))
    return llm


def _ls(capsys, *args) -> dict:
    assert main(["cache", "ls", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_ls_and_verify_a_tier_written_by_a_run(tmp_path, capsys):
    cfg = _config(tmp_path)
    _fill(cfg).close()
    (entry,) = _ls(capsys, "--config", str(cfg))[str(tmp_path / "cache")]
    assert entry["records"] == 6 * 10 and entry["torn"] == 0 and entry["in_use_by"] is None  # 160 tokens = 10 blocks
    assert entry["block_tokens"] == 16 and entry["namespace"]["dtype"] == "float32"
    assert entry["digest"] in entry["path"] and entry["disk_bytes"] < entry["capacity_bytes"]
    assert main(["cache", "ls", "--path", str(tmp_path / "cache")]) == 0
    text = capsys.readouterr().out
    assert f"namespace {entry['digest']}" in text and "60 records of" in text and "not in use" in text
    # The model as a person names it (it was shown only as its config's digest); never in the digest.
    assert entry["namespace"]["label"] == "tiny" and "(model tiny, dtype float32)" in text
    assert main(["cache", "verify", "--path", str(tmp_path / "cache")]) == 0
    assert "60 intact" in capsys.readouterr().out

    # One flipped data byte: verify names the reason and fails; the record is left for the engine to drop.
    path = entry["path"]
    with open(path, "r+b") as f:
        layout, _ = parse_file_header(f.read(4096))
        f.seek(layout.offset(3) + RECORD_HEADER + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    assert main(["cache", "verify", "--path", str(tmp_path / "cache")]) == 1
    assert "59 intact, 1 failed (checksum 1)" in capsys.readouterr().out


def test_verify_uses_the_configs_secret(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVO_CACHE_SECRET", "s" * 32)
    cfg = _config(tmp_path, auth_env="KVO_CACHE_SECRET")
    _fill(cfg).close()
    assert main(["cache", "verify", "--config", str(cfg)]) == 0
    assert "60 intact" in capsys.readouterr().out
    assert main(["cache", "verify", "--path", str(tmp_path / "cache")]) == 1  # no secret: the checksum fails
    captured = capsys.readouterr()
    assert "60 failed (checksum 60)" in captured.out and "pass --config with its auth" in captured.err


def test_clear_never_removes_what_an_engine_holds(tmp_path, capsys):
    cfg = _config(tmp_path)
    llm = _fill(cfg)
    try:
        (entry,) = _ls(capsys, "--config", str(cfg))[str(tmp_path / "cache")]
        assert entry["in_use_by"].startswith(f"process {os.getpid()} (")
        assert main(["cache", "clear", "--config", str(cfg), "--yes"]) == 1
        assert f"in use by process {os.getpid()}" in capsys.readouterr().err
        assert os.path.exists(entry["path"])
    finally:
        llm.close()
    assert main(["cache", "clear", "--namespace", "0123456789abcdef", "--config", str(cfg)]) == 2
    assert "no tier file of that namespace" in capsys.readouterr().err
    # Without a terminal and without --yes: the list of what would go, and nothing removed.
    assert main(["cache", "clear", "--namespace", entry["digest"], "--config", str(cfg)]) == 2
    captured = capsys.readouterr()
    assert f"will remove:\n  {entry['path']} (" in captured.out and "pass --yes" in captured.err
    assert os.path.exists(entry["path"])
    assert main(["cache", "clear", "--namespace", entry["digest"], "--config", str(cfg), "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"removed {entry['path']}" in out and ".namespace.json" in out
    assert sorted(os.listdir(tmp_path / "cache")) == []
    assert _ls(capsys, "--config", str(cfg)) == {str(tmp_path / "cache"): []}
    # The engine starts again on the cleared directory, cold.
    again = LLM(EngineConfig(num_gpu_blocks=48, kv_offload=str(cfg)))
    assert again.stats()["connector"]["tier_blocks_recovered"]["disk"] == 0
    again.close()


def test_default_directory_and_missing_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path / "nothing-here"))
    assert main(["cache", "ls"]) == 0
    assert f"{tmp_path / 'nothing-here'}: no disk tier files" in capsys.readouterr().out
    assert main(["cache", "clear", "--yes"]) == 0 and "nothing to clear" in capsys.readouterr().out
    assert main(["cache", "ls", "--config", "no_such.yaml"]) == 2
    assert "cannot read config file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cache"])  # a subcommand is required


def _tier_files(directory) -> list[str]:
    return sorted(p for p in os.listdir(directory) if p.startswith("kvoffload-"))


@pytest.mark.parametrize("packaged", [False, True])
def test_clear_with_a_config_without_a_disk_tier_touches_no_other_cache(tmp_path, capsys, monkeypatch, packaged):
    """A cpu + fs config names no disk tier: clear must not fall back to the per-user cache."""
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path / "user-cache"))
    user_cfg = tmp_path / "user.yaml"
    user_cfg.write_text(yaml.safe_dump({"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                                                  {"medium": "disk", "capacity": "4MiB", "write_through": True,
                                                   **PATIENT}]}))
    _fill(user_cfg).close()
    before = _tier_files(tmp_path / "user-cache")
    assert any(p.endswith(".kvdata") for p in before) and any(p.endswith(".namespace.json") for p in before)
    if packaged:
        monkeypatch.setenv("KV_SHARED", str(tmp_path / "shared"))
        cfg = "fs"
    else:
        cfg = tmp_path / "fs.yaml"
        cfg.write_text(yaml.safe_dump({"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                                                 {"medium": "fs", "capacity": "4MiB", "path": str(tmp_path / "fs")}]}))
    for command in ("clear", "ls", "verify"):
        assert main(["cache", command, "--config", str(cfg), *(["--yes"] if command == "clear" else [])]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --config {cfg}: it has no disk tier (its tiers: cpu, fs)") and "--path" in err
    assert _tier_files(tmp_path / "user-cache") == before


def test_ls_shows_the_namespace_and_clear_keeps_a_running_engines_namespace_file_with_auth(tmp_path, capsys,
                                                                                           monkeypatch):
    monkeypatch.setenv("KVO_CACHE_SECRET", "s" * 32)
    cfg = _config(tmp_path, auth_env="KVO_CACHE_SECRET")
    llm = _fill(cfg)
    try:
        names = _tier_files(tmp_path / "cache")
        assert len(names) == 2  # the tier file and its namespace file, under one digest
        assert names[0].split("-")[1] == names[1].split("-")[1].split(".")[0]
        (entry,) = _ls(capsys, "--config", str(cfg))[str(tmp_path / "cache")]
        assert entry["namespace_digest"] == llm.kv_info.namespace.digest != entry["digest"]  # the secret folded in
        assert main(["cache", "ls", "--config", str(cfg)]) == 0
        text = capsys.readouterr().out
        assert f"namespace {entry['namespace_digest']}, tier {entry['digest']} (" in text and "unknown" not in text
        assert main(["cache", "clear", "--config", str(cfg), "--yes"]) == 1
        assert "in use by" in capsys.readouterr().err
        assert _tier_files(tmp_path / "cache") == names  # neither file of the running engine removed
    finally:
        llm.close()
    assert main(["cache", "clear", "--namespace", entry["namespace_digest"], "--config", str(cfg), "--yes"]) == 0
    assert _tier_files(tmp_path / "cache") == []


def test_a_damaged_cache_directory_names_each_bad_entry_and_lists_the_rest(tmp_path, capsys):
    cfg = _config(tmp_path)
    _fill(cfg).close()
    cache = tmp_path / "cache"
    (good,) = [p for p in _tier_files(cache) if p.endswith(".kvdata")]
    (cache / "kvoffload-0000000000000000-4096.kvdata").mkdir()
    os.mkfifo(cache / "kvoffload-1111111111111111-4096.kvdata")
    os.mkfifo(cache / "kvoffload-2222222222222222.namespace.json")  # read with O_NONBLOCK: never hangs
    os.symlink(cache / good, cache / "kvoffload-3333333333333333-4096.kvdata")
    for command, rc in (("ls", 0), ("verify", 0), ("clear", 0)):
        assert main(["cache", command, "--path", str(cache), *(["--yes"] if command == "clear" else [])]) == rc
        captured = capsys.readouterr()
        assert "skipped " + str(cache / "kvoffload-0000000000000000-4096.kvdata") + ": a directory, not a tier file; " \
            "remove it" in captured.err
        assert "kvoffload-1111111111111111-4096.kvdata: a FIFO, not a tier file" in captured.err
        assert "kvoffload-3333333333333333-4096.kvdata: a symlink, not a tier file" in captured.err
        assert good in captured.out
    assert not (cache / good).exists()  # clear went on with the real file
    assert (cache / "kvoffload-0000000000000000-4096.kvdata").is_dir()  # and removed nothing it skipped
    assert main(["cache", "ls", "--json", "--path", str(cache)]) == 0
    assert json.loads(capsys.readouterr().out) == {str(cache): []}
