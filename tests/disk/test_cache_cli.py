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


def _config(tmp_path, auth_env: str | None = None):
    cfg = {"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                     {"medium": "disk", "capacity": "4MiB", "path": str(tmp_path / "cache"), "write_through": True}]}
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
        assert main(["cache", "clear", "--config", str(cfg)]) == 1
        assert f"in use by process {os.getpid()}" in capsys.readouterr().err
        assert os.path.exists(entry["path"])
    finally:
        llm.close()
    assert main(["cache", "clear", "--namespace", "0123456789abcdef", "--config", str(cfg)]) == 2
    assert "no tier file of that namespace" in capsys.readouterr().err
    assert main(["cache", "clear", "--namespace", entry["digest"], "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert f"removed {entry['path']}" in out and ".namespace.json" in out
    assert sorted(os.listdir(tmp_path / "cache")) == []
    assert _ls(capsys, "--config", str(cfg)) == {str(tmp_path / "cache"): []}
    # The engine starts again on the cleared directory, cold.
    again = LLM(EngineConfig(num_gpu_blocks=48, kv_offload=str(cfg)))
    assert again.stats()["connector"]["disk_blocks_recovered"] == 0
    again.close()


def test_default_directory_and_missing_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path / "nothing-here"))
    assert main(["cache", "ls"]) == 0
    assert f"{tmp_path / 'nothing-here'}: no disk tier files" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0 and "nothing to clear" in capsys.readouterr().out
    assert main(["cache", "ls", "--config", "no_such.yaml"]) == 2
    assert "cannot read config file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cache"])  # a subcommand is required
