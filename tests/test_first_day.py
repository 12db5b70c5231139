"""A new user's first day: packaged examples by name from any directory, config errors that
say what is wrong, block sizes for the user's model, benchmarks that refuse bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.bench import degrade_bench, disk_bench, dummy_model, e2e_bench, serve_bench
from kvoffload.cli import main
from kvoffload.config import OffloadConfig, default_cache_dir
from kvoffload.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_packaged_examples_load_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = OffloadConfig.coerce("cpu_disk")  # what EngineConfig(kv_offload="cpu_disk") does
    assert [t.medium for t in cfg.tiers] == ["cpu", "disk"] and cfg.tiers[1].path == str(default_cache_dir())
    vllm = OffloadConfig.coerce("vllm_tiers")  # vLLM's config_file takes names too (tests/vllm)
    assert [t.medium for t in vllm.tiers] == ["cpu", "disk"] and vllm.tiers[1].write_through
    with pytest.raises(ConfigError, match="cannot read config file 'no_such_example'"):
        OffloadConfig.coerce("no_such_example")
    # The repository's examples/ are links to the packaged files, not copies that drift.
    for link in (ROOT / "examples").rglob("*.yaml"):
        assert link.is_symlink() and link.resolve().parent == ROOT / "kvoffload" / "examples", link


@pytest.mark.parametrize(("tiers", "message"), [
    ([{"medium": "ram", "capacity": "1GiB"}], "tiers[0].medium: 'ram' is not a medium; the first tier is cpu"),
    ([{"medium": "cpu", "capacity": "-8GiB"}], "tiers[0].capacity: size must be positive, got '-8GiB'"),
    ([{"medium": "cpu", "capacity": " -1 MiB"}], "size must be positive"),
])
def test_config_errors_say_what_is_wrong(tiers, message):
    with pytest.raises(ConfigError) as exc:
        OffloadConfig.from_dict({"tiers": tiers})
    assert message in str(exc.value)


def test_config_check_sizes_blocks_for_the_users_model(tmp_path, capsys):
    dummy_model.write_model(tmp_path / "m", 8, 512, 8, 4, 1000)  # 8 layers x 4 KV heads x 64 dims, fp32
    assert main(["config", "check", "cpu", "--model", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    # 2 (K, V) x 8 x 4 x 64 x 4 bytes x 16 tokens = 256 KiB; the example's 64 MiB = 256 blocks
    assert "offloaded block: 16 tokens (1 engine block(s)), 256.00 KiB" in out and "= 256 blocks" in out
    assert main(["config", "check", "cpu", "--model", str(tmp_path / "m"), "--block-size", "128"]) == 0
    assert "128 tokens (1 engine block(s)), 2.00 MiB" in capsys.readouterr().out
    assert main(["config", "check", "cpu", "--model", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model" in err and "give a checkpoint directory" in err
    assert main(["config", "check", "cpu", "--block-size", "0"]) == 2
    assert "--block-size 0: must be a positive number" in capsys.readouterr().err


def test_config_check_environment_errors_name_the_file(tmp_path, capsys):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(json.dumps({"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                                         {"medium": "disk", "capacity": "1MiB", "path": str(tmp_path / "a" / "b")}]}))
    assert main(["config", "check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg}: tiers[1]") and "neither does its parent" in err


@pytest.mark.parametrize("bench", [e2e_bench, disk_bench, serve_bench, degrade_bench])
def test_benchmarks_refuse_zero_reps_in_one_line(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--reps", "0"])
    assert exc.value.code == 2
    assert "argument --reps: 0: must be >= 1" in capsys.readouterr().err


def test_the_degrade_benchmark_refuses_a_bad_speed_in_one_line(capsys):
    with pytest.raises(SystemExit):
        degrade_bench.main(["--slow", "fast"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--slow fast" in err and "e.g. disk:20MB/s:50ms" in err


def test_the_package_is_typed():
    assert (ROOT / "kvoffload" / "py.typed").is_file()
    code = "import importlib.resources as r; print(r.files('kvoffload').joinpath('py.typed').is_file())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"


def test_run_writes_its_report_as_json_for_scripts(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", "--conversations", "3", "--turns", "2", "--max-tokens", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "timings are one run of each column" in text
    data = json.loads(out.read_text())
    assert data["outputs_identical"] is True and set(data["columns"]) == {"no offload", "offload"}
    off = data["columns"]["offload"]
    assert off["prompt tokens"] == data["columns"]["no offload"]["prompt tokens"] > 0
    assert isinstance(off["TTFT p50 (ms)"], float) and 0 < off["prefix-cache hit rate"] <= 1


def test_stats_record_is_the_stats_dict_typed():
    from kvoffload.engine import LLM, EngineConfig, EngineStats, SamplingParams

    with LLM(EngineConfig(num_gpu_blocks=32, kv_offload="cpu")) as llm:
        prompt = list(range(1, 120))
        llm.generate(prompt, SamplingParams(max_tokens=2))
        llm.reset_prefix_cache()  # the second request can only hit the CPU tier
        llm.generate(prompt, SamplingParams(max_tokens=2))
        raw, rec = llm.stats(), llm.stats_record()
    assert isinstance(rec, EngineStats) and rec.requests == raw["requests"] == 2
    assert rec.prefix_hit_tokens == raw["prefix_hit_tokens"] and rec.offload_hit_tokens == raw["prefix_hit_tokens"]["cpu"] > 0
    assert rec.prompt_hit_tokens <= rec.prompt_tokens and rec.external_hit_tokens >= rec.offload_hit_tokens
