"""`kvoffload bench plan --log FILE`: the user's own log as one more validation workload, served
live beside the chat one; a log the engine's model cannot read is one line with the way out."""

from __future__ import annotations

import argparse
import json

import pytest

from kvoffload.bench.plan_bench import _workloads
from kvoffload.plan.request_log import RequestLogError


def _args(log, engine="bundled") -> argparse.Namespace:
    return argparse.Namespace(conversations=2, context=128, weka=None, log=str(log), log_limit=200, engine=engine)


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
