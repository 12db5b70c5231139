"""`kvoffload bench plan --log FILE`: the user's own log as one more validation workload, served
live beside the chat one; a log the engine's model cannot read is one line with the way out."""

from __future__ import annotations

import argparse
import json

import pytest

from kvoffload.bench.plan_bench import _workloads
from kvoffload.plan.request_log import RequestLogError


def _args(log, engine="bundled", **more) -> argparse.Namespace:
    return argparse.Namespace(**{"conversations": 2, "context": 128, "weka": None, "log": str(log), "log_limit": 200,
                                 "engine": engine, "tiers": None, "device_blocks": None, **more})


def test_the_users_log_becomes_a_workload_of_its_sessions(tmp_path):
    log = tmp_path / "mine.jsonl"
    rows = [{"timestamp": t, "session": f"c{t % 2}", "prompt_token_ids": [5] * 40 + [t % 2] * (8 + t), "max_tokens": 4}
            for t in range(6)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = _workloads(_args(log), 16)
    assert set(got) == {"chat", "log"}
    sessions = got["log"].sessions
    assert len(sessions) == 2 and [len(s.turns) for s in sessions] == [3, 3]
    assert sessions[0].turns[1] == tuple([5] * 40 + [0] * 10)  # each turn as logged


def test_ids_past_the_bundled_models_vocabulary_name_the_way_out(tmp_path):
    log = tmp_path / "big.jsonl"
    log.write_text(json.dumps({"prompt_token_ids": [1, 30000]}) + "\n")
    with pytest.raises(RequestLogError) as exc:
        _workloads(_args(log), 16)
    assert str(exc.value).startswith(f"--log {log}: line 1: prompt_token_ids must be a non-empty list of ints in "
                                     "[0, 258): past the 258 token ids")
    assert "use --engine vllm" in str(exc.value) and "\n" not in str(exc.value)
    assert "log" in _workloads(_args(log, engine="vllm"), 128)  # vLLM's model reads 32,000


def test_checking_a_plan_answer_runs_that_log_alone(tmp_path):
    log = tmp_path / "mine.jsonl"
    log.write_text(json.dumps({"session": "a", "prompt_token_ids": [5] * 40}) + "\n")
    assert set(_workloads(_args(log, tiers="cpu:1MiB"), 16)) == {"log"}
    assert set(_workloads(_args(log, device_blocks=96), 16)) == {"log"}


def test_a_device_cache_no_engine_can_run_is_refused_before_anything_runs(capsys):
    from kvoffload.bench.plan_bench import main

    with pytest.raises(SystemExit):
        main(["--log", "sample", "--tiers", "cpu:1MiB", "--device-blocks", "16"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("--device-blocks 16: the log workload's longest request needs 86 blocks of 16 tokens to run; "
                        "give at least that")
    with pytest.raises(SystemExit):
        main(["--model", "small", "--log", "sample"])
    assert "--model small: the bundled engine runs tiny" in capsys.readouterr().err


def test_plans_check_command_runs_the_same_chain_and_device_cache_live(capsys):
    """The command `plan` prints, run: its chain and device cache on the bundled engine, plan's
    prediction beside the engine's counts (the device's tokens equal; a CPU tier's within a
    block a request)."""
    from importlib import resources

    from kvoffload.bench.plan_bench import main

    profile = str(resources.files("kvoffload") / "examples" / "plan" / "profile.yaml")
    assert main(["--log", "sample", "--tiers", "cpu:1MiB", "--device-blocks", "96", "--log-limit", "8",
                 "--profile", profile]) == 0
    out = capsys.readouterr().out
    assert "\nchat " not in out and "log on the bundled engine:" in out and "device 96 blocks; cpu:1MiB" in out
    rows = [line for line in out.splitlines() if line.startswith("  rep 1 cpu:1MiB: ")]
    assert len(rows) == 1 and "cpu tokens" in rows[0]
    import re

    predicted, measured = (float(x.replace(",", "")) for x in
                           re.search(r"cpu tokens ([\d,.]+) vs ([\d,.]+)", rows[0]).groups())
    assert abs(predicted - measured) <= 8 * 16
