"""``kvoffload bench serve --engine bundled``: the serving workloads on the bundled engine, with
a streaming view of each request, identical tokens with and without offload, and hits."""

from __future__ import annotations

import json

import pytest
import torch

from kvoffload.bench import dummy_model, serve_bench, serve_configs
from kvoffload.bench.serve_bundled import run_bundled
from kvoffload.bench.serve_workloads import chat
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.llm import LLM
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.errors import ConfigError

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "500"]


def _engine(tmp_path, kv_offload=None) -> LLM:
    model = tmp_path / "model"
    dummy_model.write_model(model, 2, 64, 4, 2, 500)
    return LLM(EngineConfig(model=str(model), load_format="dummy", block_size=16, num_gpu_blocks=24,
                            max_model_len=512, max_num_seqs=8, kv_offload=kv_offload))


def test_streaming_view_and_collect_equal_generate(tmp_path):
    llm = _engine(tmp_path)
    prompt = list(range(3, 40))
    expected = llm.generate(prompt, SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    rid = llm.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True), "s")
    seen: list[int] = []
    done: list[str] = []
    while not done:
        done = llm.step()
        now = llm.output_token_ids(rid)
        assert now[: len(seen)] == seen and len(now) <= len(seen) + 1  # one token a step, never rewritten
        seen = now
    assert done == ["s"] and seen == expected
    out = llm.collect("s")
    assert out.token_ids == expected and out.finish_reason == "length" and out.ttft_s is not None
    assert llm.output_token_ids("s") == []  # forgotten
    with pytest.raises(KeyError, match="'s' has not finished"):
        llm.collect("s")
    llm.close()


def test_dummy_weights_need_only_a_config_and_a_valid_load_format(tmp_path):
    with pytest.raises(ValueError, match="load_format='fast'"):
        EngineConfig(load_format="fast")
    dummy_model.write_model(tmp_path, 2, 64, 4, 2, 500)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        LLM(EngineConfig(model=str(tmp_path)))  # "auto" still wants the weights
    llm = LLM(EngineConfig(model=str(tmp_path), load_format="dummy", num_gpu_blocks=16))
    assert llm.model_config.num_hidden_layers == 2 and llm.model_config.checkpoint_dir is None
    llm.close()


def test_chat_on_the_bundled_engine_hits_the_cpu_tier_with_identical_tokens(tmp_path):
    wl = chat(conversations=4, turns=3, context=96, user=16, max_tokens=4, think_s=0.0, vocab=500, seed=1)
    runs = {}
    for name, kv in (("plain", None), ("cpu", {"tiers": [{"medium": "cpu", "capacity": "16MiB"}]})):
        llm = _engine(tmp_path / name, kv)
        turns, wall = run_bundled(llm, wl)
        runs[name] = (turns, llm.stats())
        llm.close()
        assert wall > 0 and len(turns) == 12
        for sid, turn, c in turns:
            assert c.ok and len(c.tokens[0]) == 4 and len(c.times) == 4
            assert c.times == sorted(c.times) and c.ttft > 0
    tokens = {name: {(s, t): c.tokens[0] for s, t, c in turns} for name, (turns, _) in runs.items()}
    assert tokens["plain"] == tokens["cpu"]
    # 24 device blocks hold about one conversation: returning turns reload the rest from CPU.
    assert runs["cpu"][1]["prefix_hit_tokens"]["cpu"] > 0
    assert runs["plain"][1]["prefix_hit_tokens"].get("cpu", 0) == 0


def test_the_cli_runs_the_bundled_engine_end_to_end(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = serve_bench.main(["--engine", "bundled", "--workload", "chat", "--conversations", "3", "--turns", "2",
                           "--context", "64", "--user-tokens", "16", "--max-tokens", "3", "--think", "0",
                           "--configs", "plain,cpu", "--cpu", "16MiB", "--reps", "2", "--json", str(out), *TINY])
    assert rc == 0
    text = capsys.readouterr().out
    assert "returning-turn TTFT p50" in text and "tokens identical to plain engine cpu: 2/2 runs" in text
    data = json.loads(out.read_text())
    assert data["engine"] == "bundled" and data["configs"]["cpu"]["identical_runs"] == 2
    assert len(data["configs"]["cpu"]["ttft_p50_ms_vs_plain"]) == 2


def test_load_modes_and_a_throttled_tier_in_one_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KVOFFLOAD_THROTTLE", raising=False)
    out = tmp_path / "r.json"
    rc = serve_bench.main(["--engine", "bundled", "--workload", "chat", "--conversations", "3", "--turns", "2",
                           "--context", "64", "--user-tokens", "16", "--max-tokens", "3", "--think", "0",
                           "--configs", "plain,cpu+disk:async,cpu+disk", "--also-vs", "cpu+disk:async",
                           "--throttle-tier", "disk:1GB/s:1ms", "--cpu", "16MiB", "--reps", "1", "--json", str(out),
                           *TINY])
    assert rc == 0
    text = capsys.readouterr().out
    assert "vs cpu+disk:async (x better)" in text and "tokens identical to plain engine cpu+disk: 1/1 runs" in text
    data = json.loads(out.read_text())
    assert len(data["configs"]["cpu+disk"]["ttft_p50_ms_vs_cpu+disk:async"]) == 1
    assert len(data["configs"]["plain"]["ttft_p50_ms_vs_cpu+disk:async"]) == 1  # the reference vs plain too
    with pytest.raises(SystemExit):
        serve_bench.main(["--engine", "bundled", "--configs", "plain,cpu", "--also-vs", "cpu:async", *TINY])
    assert "--also-vs cpu:async: not one of --configs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_bench.main(["--engine", "bundled", "--throttle-tier", "disk:fast", *TINY])
    assert "--throttle-tier: throttle 'disk:fast': use MEDIUM:BANDWIDTH:LATENCY" in capsys.readouterr().err


def test_the_cli_refuses_what_the_bundled_engine_cannot_do(capsys):
    with pytest.raises(SystemExit):
        serve_bench.main(["--engine", "bundled", "--url", "http://127.0.0.1:1"])
    assert "--url measures a running vLLM server" in capsys.readouterr().err
    with pytest.raises(ValueError, match="'mooncake'"):
        serve_bench.main(["--engine", "bundled", "--configs", "plain,mooncake", "--reps", "1", *TINY])
    with pytest.raises(SystemExit):
        serve_bench.main(["--device", "cuda"])
    assert "--device cuda: only the bundled engine takes a device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            serve_bench.main(["--engine", "bundled", "--device", "cuda:0"])
        assert "--device cuda:0: no such device here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_bench.main(["--engine", "bundled", "--device", "tpu"])
    assert "--device tpu: no such device here" in capsys.readouterr().err


def test_the_cli_refuses_replicas_it_cannot_route(capsys):
    with pytest.raises(SystemExit):
        serve_bench.main(["--replicas", "2", "--configs", "plain"])
    assert "--replicas 2 --configs plain: name one kvoffload configuration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_bench.main(["--replicas", "2", "--configs", "cpu,cpu+disk"])
    assert "name one kvoffload configuration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_bench.main(["--replicas", "2", "--engine", "bundled"])
    assert "--replicas runs vllm serve replicas" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_bench.main(["--replicas", "0"])


@pytest.mark.parametrize("bad", ["DYN_ROUTER_TEMPERATURE", "PATH=/tmp", "DYN_X= ", "=2"])
def test_router_settings_are_dynamo_variables_or_refused_in_one_line(capsys, bad):
    import argparse

    from kvoffload.bench import serve_routing

    p = argparse.ArgumentParser(prog="kvoffload bench serve")
    assert serve_routing.router_settings(p, None) == serve_routing.ROUTER_SETTINGS
    assert serve_routing.router_settings(p, ["default"]) == {}
    assert serve_routing.router_settings(p, ["DYN_ROUTER_TEMPERATURE=0.5", "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT=0.9"]) == {
        "DYN_ROUTER_TEMPERATURE": "0.5", "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT": "0.9"}
    with pytest.raises(SystemExit):
        serve_routing.router_settings(p, [bad])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--router-setting {bad!r}: give NAME=VALUE with a Dynamo variable" in err


def test_the_default_policy_file_ships_and_a_missing_one_is_refused_in_one_line(capsys, tmp_path):
    import argparse

    import yaml

    from kvoffload.bench import serve_routing

    policy = yaml.safe_load(serve_routing.POLICY.read_text())
    assert policy["router"] == {"host_cache_hit_weight": 1.0}
    (instance,) = policy["worker_selection"]["instances"]
    assert instance["type"] == "dynamo-default-cost-fn" and policy["worker_selection"]["aggregated"] == instance["name"]
    p = argparse.ArgumentParser(prog="kvoffload bench serve")
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SystemExit):
        serve_routing.router_settings(p, [f"DYN_ROUTER_POLICY_CONFIG={missing}"])
    assert "no such file; give a Dynamo policy YAML" in capsys.readouterr().err


def test_a_stuck_engine_fails_the_run_instead_of_hanging(monkeypatch):
    from kvoffload.bench import serve_bundled

    class Stuck:  # accepts requests, never produces a token
        def add_request(self, prompt, params, rid, hint=None):
            return rid

        def step(self):
            return []

        def output_token_ids(self, rid):
            return []

    monkeypatch.setattr(serve_bundled, "_MAX_STALL_S", 0.2)
    wl = chat(conversations=2, turns=1, context=8, user=2, max_tokens=2, think_s=0.0, vocab=50)
    with pytest.raises(RuntimeError, match=r"no progress for 0.2 s; requests \['c0/0', 'c1/0'\]"):
        run_bundled(Stuck(), wl)  # type: ignore[arg-type]


def test_configuration_names_read_plain_default_as_plain_and_refuse_unknown_ones(tmp_path):
    names = serve_configs.config_names("plain,plain-default,cpu,cpu")
    assert names == ["plain", "cpu"]
    configs = serve_configs.configurations(names, "1GB", "2GB", tmp_path)
    assert configs["plain"] is None
    assert configs["cpu"]["kv_connector"] == "KVOffloadConnector"
    assert configs["cpu"]["kv_connector_extra_config"]["config"]["tiers"][0]["medium"] == "cpu"
    with pytest.raises(ValueError, match="'gpu'; use plain, cpu, cpu"):
        serve_configs.configurations(["gpu"], "1GB", "2GB", tmp_path)
    slow = serve_configs.configurations(["cpu+disk:never-recompute"], "1GB", "2GB", tmp_path, throttled=True)
    config = slow["cpu+disk:never-recompute"]["kv_connector_extra_config"]["config"]
    assert config["load_mode"] == "never-recompute" and config["spec_name"] == "ThrottledOffloadingSpec"
    with pytest.raises(ConfigError, match="load_mode: 'sometimes' is not a load mode"):
        serve_configs.configurations(["cpu:sometimes"], "1GB", "2GB", tmp_path)


@pytest.mark.parametrize("hf, hybrid, expected", [
    ({}, False, False),                                                     # Llama-shaped: one KV kind
    ({"layer_types": ["full_attention"] * 4}, False, False),
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64}, False, True),  # Gemma 3
    ({"sliding_window": 4096}, False, True),                                # Mistral-style window
    ({}, True, True),                                                       # Mamba state groups
])
def test_the_hybrid_allocator_setting_is_compared_only_where_it_changes_the_engine(hf, hybrid, expected):
    from types import SimpleNamespace

    from kvoffload.bench.serve_configs import _has_several_kv_kinds

    assert _has_several_kv_kinds(SimpleNamespace(hf_text_config=SimpleNamespace(**hf), is_hybrid=hybrid)) is expected


def test_mix_runs_in_rounds_each_turn_after_its_answer_and_each_group_at_its_lag():
    from kvoffload.bench.serve_workloads import in_rounds, mix

    wl = mix(conversations=2, fresh=3, rounds=2, context=48, user=16, fresh_tokens=64, max_tokens=2, first="fresh",
             vocab=500, seed=3)
    assert wl.rounds == 3 and wl.name == "mix-fresh-first"
    seen = []

    class Done:
        def __init__(self, sid: str, turn: int) -> None:
            self.tokens = {0: [900 + turn, 901]}  # a recognisable answer per round

    def run(sub):
        seen.append(sub)
        return [(s.sid, 0, Done(s.sid, len(seen))) for s in sub.sessions], 0.5

    results, wall = in_rounds(wl, run)
    assert wall == 1.5 and len(results) == 2 * 3 + 3 * 2
    assert [sorted(s.sid for s in sub.sessions) for sub in seen] == [
        ["c0", "c1"], ["c0", "c1", "f1.0", "f1.1", "f1.2"], ["c0", "c1", "f2.0", "f2.1", "f2.2"]]
    assert {s.sid: s.start_s for s in seen[1].sessions} == {"c0": 0.05, "c1": 0.05, "f1.0": 0.0, "f1.1": 0.0,
                                                            "f1.2": 0.0}  # fresh first, turns 50 ms later
    c0 = wl.sessions[0]
    opening = list(c0.prefix) + list(c0.turns[0])
    assert list(seen[0].sessions[0].turns[0]) == opening
    assert list(seen[1].sessions[0].turns[0]) == opening + [901, 901] + list(c0.turns[1])  # after its answer
    assert list(seen[2].sessions[0].turns[0])[: len(opening) + 2 + 16] == opening + [901, 901] + list(c0.turns[1])
    assert sorted((sid, turn) for sid, turn, _ in results if sid == "c1") == [("c1", 0), ("c1", 1), ("c1", 2)]
    assert {turn for sid, turn, _ in results if sid.startswith("f")} == {0}  # fresh prompts never return
    with pytest.raises(ValueError, match="--first 'both'"):
        mix(first="both")


def test_mix_on_the_bundled_engine_serves_identical_tokens_and_loads_the_turns(tmp_path):
    from kvoffload.bench.serve_workloads import in_rounds, mix

    wl = mix(conversations=3, fresh=2, rounds=2, context=96, user=16, fresh_tokens=160, max_tokens=3, vocab=500)
    tokens, hits = {}, {}
    for name, kv in (("plain", None), ("cpu", {"tiers": [{"medium": "cpu", "capacity": "16MiB"}]})):
        llm = _engine(tmp_path / name, kv)
        turns, _ = in_rounds(wl, lambda sub, llm=llm: run_bundled(llm, sub))
        tokens[name] = {(s, t): c.tokens[0] for s, t, c in turns}
        hits[name] = llm.stats()["prefix_hit_tokens"]
        llm.close()
    assert len(tokens["plain"]) == 3 * 3 + 2 * 2 and tokens["plain"] == tokens["cpu"]
    assert hits["cpu"].get("cpu", 0) > 0 and hits["plain"].get("cpu", 0) == 0


def test_routed_runs_report_each_replicas_hits_and_requests():
    from kvoffload.bench.serve_report import report
    from kvoffload.bench.serve_runs import RunResult, TurnResult
    from kvoffload.testing.http_client import Completion

    def run(name: str, replicas: list[dict[str, float]]) -> RunResult:
        c = Completion(tokens={0: [5, 6]}, times=[0.1, 0.2], status=200)
        hits = {"cpu": sum(r["cpu"] for r in replicas), "device": sum(r["device"] for r in replicas)}
        return RunResult(name, [TurnResult("c0", 0, c), TurnResult("c0", 1, c)], 1.0, hits, replicas)

    runs = {"round-robin": [run("round-robin", [{"cpu": 512, "device": 256, "requests": 6},
                                                {"cpu": 128, "device": 384, "requests": 6}])],
            "dynamo": [run("dynamo", [{"cpu": 1024, "device": 0, "requests": 11},
                                      {"cpu": 0, "device": 128, "requests": 1}])]}
    text, data = report(runs, references=("round-robin",))
    assert "  run 1, per replica            r1: cpu 1,024, device 0, requests 11 | r2: cpu 0, device 128, requests 1" \
        in text.splitlines()
    assert "prefix hit tokens/run dynamo    cpu 1,024, device 128" in text.splitlines()
    assert data["configs"]["dynamo"]["replicas_per_run"] == [[{"cpu": 1024, "device": 0, "requests": 11},
                                                              {"cpu": 0, "device": 128, "requests": 1}]]
