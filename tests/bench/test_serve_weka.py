"""``bench serve --workload trace --trace weka``: WEKA's agent sessions replayed with the hints
their callers had, sent only to configurations whose host tier evicts by the hinted policy."""

from __future__ import annotations

import pytest

from kvoffload.bench import dummy_model, serve_bench, serve_configs
from kvoffload.bench.serve_bundled import run_bundled
from kvoffload.bench.serve_workloads import weka
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.llm import LLM
from kvoffload.errors import ConfigError
from tests.weka_traces import write_weka_tar

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "500"]


def write_weka(path) -> None:
    """Three conversations in WEKA's format: one of four requests, one whose sub-agent's
    requests count as its own, and one of a single request (not a session to replay)."""
    convs = [
        {"id": "alpha", "requests": [
            {"t": 0.0, "hash_ids": [1, 2, 3], "stop": "tool_use"},
            {"t": 4.0, "hash_ids": [1, 2, 3, 4], "stop": ""},
            {"t": 6.0, "hash_ids": [1, 2, 3, 4, 5], "stop": "end_turn"},
            {"t": 100.0, "hash_ids": [1, 2, 3, 4, 5, 6], "stop": "tool_use"}]},
        {"id": "beta", "requests": [
            {"t": 0.0, "hash_ids": [1, 9], "stop": "tool_use"},
            {"type": "subagent", "requests": [{"t": 2.0, "hash_ids": [7, 8], "stop": "end_turn"}]}]},
        {"id": "gamma", "requests": [{"t": 0.0, "hash_ids": [1], "stop": "end_turn"}]},
    ]
    write_weka_tar(path, convs)


def test_weka_sessions_keep_prefixes_times_and_honest_hints(tmp_path):
    path = tmp_path / "weka.tar.gz"
    write_weka(path)
    wl = weka(path, conversations=8, turns=3, block_tokens=2, max_blocks=4, time_scale=0.5, vocab=100)
    assert wl.name == "weka" and [s.sid for s in wl.sessions] == ["w0", "w1"]  # gamma: one request
    alpha, beta = wl.sessions
    assert alpha.whole and len(alpha.turns) == 3 and [len(t) for t in alpha.turns] == [6, 8, 8]  # 4 blocks at most
    assert alpha.turns[1][:6] == alpha.turns[0] and alpha.turns[2] == alpha.turns[1]  # shared blocks, equal tokens
    assert beta.turns[0][:2] != alpha.turns[0][:2]  # block 1 of another conversation is another block
    assert (alpha.start_s, beta.start_s) == (0.0, 15.0)  # conversations 30 s apart in the trace, replayed at 0.5
    assert alpha.thinks == (0.0, 2.0, 1.0)
    assert alpha.hints == ({"session": "weka-0", "expect_return_s": 10.0}, {"session": "weka-0", "expect_return_s": 10.0},
                           {"session": "weka-0"})  # end_turn: a return nobody can tell
    assert beta.hints[1] == {"session": "weka-1"}  # the sub-agent's request is the conversation's
    assert alpha.prompt(1, [99]) == list(alpha.turns[1])  # a whole prompt: no history in front
    assert wl.working_set_tokens == 2 * 8  # 6 distinct blocks of alpha (4 kept), 3 of beta (x2 tokens)


def test_only_hinted_configurations_get_the_hints(tmp_path):
    path = tmp_path / "weka.tar.gz"
    write_weka(path)
    wl = weka(path, conversations=8, turns=4, block_tokens=8, time_scale=0.001, vocab=500)
    model = tmp_path / "model"
    dummy_model.write_model(model, 2, 64, 4, 2, 500)
    tokens = {}
    for hints in (False, True):
        offload = {"tiers": [{"medium": "cpu", "capacity": "16MiB", "eviction_policy": "hinted"}]}
        with LLM(EngineConfig(model=str(model), load_format="dummy", block_size=16, num_gpu_blocks=24,
                              max_model_len=256, max_num_seqs=8, kv_offload=offload)) as llm:
            turns, _ = run_bundled(llm, wl, hints=hints)
            stats = llm.stats()["connector"]
        assert stats["hinted_requests"] == (6 if hints else 0)  # every request of alpha (4) and beta (2)
        tokens[hints] = {(sid, turn): c.tokens[0] for sid, turn, c in turns}
    assert tokens[False] == tokens[True] and len(tokens[True]) == 6


def test_policy_suffixes_and_the_hints_clock_in_configurations(tmp_path):
    configs = serve_configs.configurations(["cpu@hinted", "cpu+disk:async@lru", "cpu@prefix_value"], "1GB", "2GB",
                                         tmp_path, hints={"clock_speed": 20.0})
    hinted = configs["cpu@hinted"]["kv_connector_extra_config"]["config"]
    assert hinted["tiers"][0]["eviction_policy"] == "hinted" and hinted["hints"] == {"clock_speed": 20.0}
    tiers = configs["cpu+disk:async@lru"]["kv_connector_extra_config"]["config"]["tiers"]
    assert tiers[0]["eviction_policy"] == "lru" and tiers[1]["path"].endswith("disk-async-lru")
    assert [serve_configs.sends_hints(n) for n in ("plain", "cpu", "cpu@prefix_value", "cpu@hinted")] == \
        [False, False, False, True]
    with pytest.raises(ConfigError, match="eviction_policy: unknown eviction policy 'mru'"):
        serve_configs.configurations(["cpu@mru"], "1GB", "2GB", tmp_path)
    with pytest.raises(ValueError, match="'cpu@'; use plain, cpu"):
        serve_configs.configurations(["cpu@"], "1GB", "2GB", tmp_path)


def test_the_cli_replays_weka_with_and_without_hints(tmp_path, capsys):
    path = tmp_path / "weka.tar.gz"
    write_weka(path)
    out = tmp_path / "r.json"
    rc = serve_bench.main(["--engine", "bundled", "--workload", "trace", "--trace", str(path), "--conversations", "2",
                           "--turns", "4", "--time-scale", "0.001", "--max-tokens", "2",
                           "--configs", "plain,cpu@prefix_value,cpu@hinted", "--also-vs", "cpu@prefix_value",
                           "--cpu", "16MiB", "--reps", "1", "--json", str(out), *TINY])
    assert rc == 0
    text = capsys.readouterr().out
    assert "workload weka on the bundled engine: 2 sessions, 6 requests" in text
    assert "tokens identical to plain engine cpu@hinted: 1/1 runs" in text and "vs cpu@prefix_value" in text
    with pytest.raises(SystemExit):
        serve_bench.main(["--engine", "bundled", "--time-scale", "0", *TINY])
    assert "--time-scale 0.0: must be in (0, 1000]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_bench.main(["--engine", "bundled", "--workload", "trace", "--trace", str(tmp_path / "nothing.tar.gz"),
                          *TINY])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--trace" in err and "nothing.tar.gz: no such file" in err
