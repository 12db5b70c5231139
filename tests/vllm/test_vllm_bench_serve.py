"""Smoke test of `kvoffload bench serve` against real `vllm serve` processes: a tiny
Llama-shaped model with dummy weights, a few chat turns, plain vLLM vs a CPU tier."""

import json

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("aiohttp")


def test_bench_serve_chat_runs_end_to_end(tmp_path, capsys):
    from kvoffload.bench.serve_bench import main

    out_json, out_png = tmp_path / "serve.json", tmp_path / "serve.png"
    assert main(["--workload", "chat", "--configs", "plain,cpu", "--conversations", "3", "--turns", "3",
                 "--context", "384", "--user-tokens", "64", "--max-tokens", "4", "--think", "0", "--layers", "2",
                 "--hidden", "128", "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--reps", "1",
                 "--json", str(out_json), "--plot", str(out_png)]) == 0
    text = capsys.readouterr().out
    assert "TTFT p50 (ms)" in text and "returning-turn TTFT p50 (ms)" in text and "vs plain" in text
    assert "tokens identical to plain vLLM   cpu: 1/1 runs" in text
    assert "warning: engine settings differ" not in text
    data = json.loads(out_json.read_text())
    assert data["configs"]["cpu"]["hit_tokens_per_run"]["cpu"] > 0  # returning turns came from the CPU tier
    assert out_png.stat().st_size > 10_000
