"""`kvoffload bench profile --from URL`: a profile from a running server's own /metrics (a real
Prometheus scrape of the bundled engine), which `plan` then prices with; a server that is down,
or one that is not kvoffload's, is one line naming what is missing."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
import torch

from kvoffload import cli
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.plan.model_shape import kv_shape
from kvoffload.plan.profile import load_profile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_profile_read_from_a_serving_engine_prices_a_plan(tmp_path, capsys):
    torch.set_num_threads(1)
    port = _free_port()
    cfg = {"tiers": [{"medium": "cpu", "capacity": "8MiB"}], "metrics": {"prometheus_port": port}}
    out = tmp_path / "served.yaml"
    with LLM(EngineConfig(model="small", num_gpu_blocks=40, kv_offload=cfg)) as llm:
        for turn in range(3):  # returning conversations: the CPU tier serves loads, the steps are timed
            for i in range(6):
                llm.generate([[(i * 31 + j) % 250 + 1 for j in range(300)] + [turn]], SamplingParams(max_tokens=4))
        assert llm.stats()["prefix_hit_tokens"]["cpu"] > 0
        assert cli.main(["bench", "profile", "--from", f"http://127.0.0.1:{port}", "--model", "small",
                         "--out", str(out)]) == 0
    assert "(in service)" in capsys.readouterr().out
    profile = load_profile(out)
    assert profile.engine.token_s > 0 and profile.engine.max_batched_tokens == 512  # the largest step it published
    assert profile.engine.shape == kv_shape("small").signature  # --model: what the server serves
    assert set(profile.tiers) == {"cpu"} and profile.tiers["cpu"].load_gb_per_s > 0
    assert profile.tiers["cpu"].store_gb_per_s > 0
    assert profile.sources["engine"].startswith("kvoffload_prefill_tokens_per_second by step size")
    assert "device_to_host" in profile.sources["tiers.cpu"]
    assert f"http://127.0.0.1:{port}, in service" in profile.machine
    assert cli.main(["plan", "--log", "sample", "--model", "small", "--tiers", "cpu:{4,16}MiB",
                     "--profile", str(out)]) == 0  # the same model: no refusal, nothing scaled
    assert "scaled" not in capsys.readouterr().out


class _Page(http.server.BaseHTTPRequestHandler):
    body = b"# HELP up a gauge\n# TYPE up gauge\nup 1\n"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("body, words", [
    (b"# TYPE up gauge\nup 1\n", "published no kvoffload_prefill_tokens_per_second"),
    (b"kvoffload_prefill_tokens_per_second{tokens=\"16\"} 1000\n", "published no tier load speeds"),
    (b"kvoffload_prefill_tokens_per_second{tokens=\"16\"} NaN\n", "published no kvoffload_prefill_tokens_per_second"),
    (b"\xff\xfe not { text", "is not Prometheus text"),
])
def test_a_server_that_is_not_kvoffloads_is_named_in_one_line(body, words, tmp_path, capsys):
    handler = type("Page", (_Page,), {"body": body})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rc = cli.main(["bench", "profile", "--from", f"http://127.0.0.1:{server.server_port}", "--model", "tiny",
                       "--out", str(tmp_path / "p.yaml")])
    finally:
        server.shutdown()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and "\n" not in err
    assert not (tmp_path / "p.yaml").exists()


def test_a_server_that_is_down_is_named_in_one_line(tmp_path, capsys):
    port = _free_port()
    assert cli.main(["bench", "profile", "--from", f"http://127.0.0.1:{port}", "--model", "tiny",
                     "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--from http://127.0.0.1:{port}: cannot read http://127.0.0.1:{port}/metrics" in err and "\n" not in err
    assert cli.main(["bench", "profile", "--from", "localhost:9", "--model", "tiny"]) == 2
    assert "give the server's address, e.g. http://127.0.0.1:8000" in capsys.readouterr().err


def test_vllms_front_end_is_its_ttft_less_the_engine_cores_own_times():
    from kvoffload.bench.profile_scrape import request_overhead, step_overheads

    metrics = {"vllm:time_to_first_token_seconds_sum": [({"engine": "0"}, 3.0)],
               "vllm:time_to_first_token_seconds_count": [({"engine": "0"}, 10.0)],
               "vllm:request_queue_time_seconds_sum": [({"engine": "0"}, 0.5)],
               "vllm:request_queue_time_seconds_count": [({"engine": "0"}, 10.0)],
               "vllm:request_prefill_time_seconds_sum": [({"engine": "0"}, 2.0)],
               "vllm:request_prefill_time_seconds_count": [({"engine": "0"}, 10.0)],
               "kvoffload_step_overhead_seconds": [({"part": "idle_step"}, 0.002), ({"part": "per_load"}, 0.001)]}
    assert request_overhead(metrics) == pytest.approx(0.3 - 0.05 - 0.2)
    assert step_overheads(metrics) == (0.002, 0.001)
    assert request_overhead({}) == 0.0 and step_overheads({}) == (0.0, 0.0)  # the bundled engine: none published
