"""The fs tier in real vLLM (CPU build): two `vllm serve` processes on one cache directory, both
running, and the second serves the first one's prompts from it, token for token."""

import time

import pytest

from kvoffload.testing.vllm_server import VllmServer
from tests.vllm.test_vllm_plugin import ktc, run_job, spec_route

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

PROMPTS = [[(i * 41 + j) % 500 + 1 for j in range(300)] for i in range(3)]


def _tiers(path):
    """The fs tier with backpressure as loose as it goes (60 s per MiB): these tests are about
    what two processes or two ranks share. A CI run with two vLLM engines on two cores had a
    TP=2 second process miss only the last prompt ([256, 256, 0], tokens identical): the mark of
    stores skipped, by design, once fs writes ran later than the default 20 ms per MiB (it
    passed alone on a quiet machine)."""
    return [{"medium": "cpu", "capacity": "64MiB"},
            {"medium": "fs", "path": str(path), "capacity": "256MiB", "max_store_ms_per_mib": 60000}]


def _round(server: VllmServer, model: str) -> tuple[list[list[int]], list[int]]:
    tokens, cached = [], []
    for prompt in PROMPTS:
        out = server.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0,
                                              "ignore_eos": True, "return_token_ids": True})
        tokens.append(out["choices"][0]["token_ids"])
        cached.append((out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return tokens, cached


def test_two_vllm_serve_processes_share_one_fs_directory(model, tmp_path):
    cfg = ktc(_tiers(tmp_path / "shared"), kv_load_failure_policy="recompute")
    args = ["--max-model-len", "1024", "--dtype", "bfloat16"]
    env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    with VllmServer(model, tmp_path / "a.log", cfg, extra_args=args, env=env) as a, \
            VllmServer(model, tmp_path / "b.log", cfg, extra_args=args, env=env) as b:
        first, cached_a = _round(a, model)
        assert cached_a == [0, 0, 0]
        second, cached_b = _round(b, model)  # b never saw these prompts: its hits are a's blocks
        assert second == first
        assert all(c >= 256 for c in cached_b), cached_b
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # stats reach the API server with the engine's next report
            hits = b.metrics().get(("kvoffload_hit_tokens_total", (("tier", "fs"),)), 0)
            if hits == sum(cached_b):
                break
            time.sleep(1)
        assert "Turning off hybrid kv cache manager" not in a.log_tail(10**7)
    plain = run_job({"model": model, "rounds": 1, "prompts": PROMPTS, "max_tokens": 6, "ignore_eos": True})
    assert first == plain[0]["tokens"]
    assert hits == sum(cached_b)  # every hit of b's came from the fs tier (its own CPU tier was empty)


def test_the_spec_route_refuses_an_fs_tier_naming_the_connector_that_serves_it(model, tmp_path):
    """vLLM's own OffloadingConnector cannot report a failed read of a slower tier (an evicted or
    torn record would be served as garbage), so KVOffloadSpec keeps to one CPU tier."""
    with pytest.raises(AssertionError, match=r"tiers: KVOffloadSpec serves exactly one CPU tier, not cpu\+fs .* "
                                             r"use \"kv_connector\": \"KVOffloadConnector\""):
        run_job({"model": model, "kv_transfer_config": spec_route(_tiers(tmp_path / "shared")), "rounds": 1})


def test_tensor_parallel_ranks_write_and_read_their_own_shards(model, tmp_path):
    """TP=2: each rank stores its half of every block as its own file; a later TP=2 process is
    served only when both halves are there, token for token."""
    cfg = ktc(_tiers(tmp_path / "shared"))
    plain = run_job({"model": model, "rounds": 1, "tp": 2})
    first = run_job({"model": model, "kv_transfer_config": cfg, "rounds": 1, "tp": 2})
    second = run_job({"model": model, "kv_transfer_config": cfg, "rounds": 1, "tp": 2})
    assert first[0]["tokens"] == second[0]["tokens"] == plain[0]["tokens"]
    assert all(c >= 256 for c in second[0]["cached"]), second[0]["cached"]
    shards = {p.name for p in (tmp_path / "shared").rglob("*.kv")}
    assert len(shards) % 2 == 0 and len(shards) >= 2 * 6  # 3 prompts x 2 stored blocks x 2 ranks
