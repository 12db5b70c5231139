"""HTTP chaos against a real vllm serve + kvoffload (a small budget; `kvoffload bench chaos
--engine vllm` runs it longer): random client disconnects, n=2 sampled requests, device and
external cache resets during loads, disk records flipped and fs records flipped, truncated,
deleted and swapped under the server, both kv_load_failure_policy values (recompute with CPU+disk
and CPU+fs). The server must stay up, every completed response must equal
plain vLLM's, and no device block may leak."""

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from kvoffload.bench.chaos_bench import make_tiny_llama  # noqa: E402
from kvoffload.testing.vllm_chaos import ChaosConfig, configurations, reference_outputs, run_chaos  # noqa: E402


def test_http_chaos_keeps_vllm_up_and_correct(tmp_path):
    make_tiny_llama(str(tmp_path / "m"))
    cfg = ChaosConfig(model=str(tmp_path / "m"), duration_s=12, clients=12)
    ref = reference_outputs(cfg, tmp_path)
    reports = [run_chaos(cfg, name, tiers, policy, tmp_path, ref, disk)
               for name, tiers, policy, disk in configurations(tmp_path)]
    for r in reports:
        assert r.ok, r.line() + "\n" + "\n".join((r.errors + r.mismatches)[:5])
        assert r.completed > 50 and r.aborted > 10
        assert r.counters.get("kvoffload_loaded_blocks_total{}", 0) > 0  # the tiers served loads under fire
    damaged = [r for r in reports if "disk" in r.name or "fs" in r.name]
    assert len(damaged) == 3 and all(r.corruptions > 0 for r in damaged)
    fs_run = next(r for r in reports if r.name == "cpu+fs/recompute")
    assert sum(v for k, v in fs_run.counters.items() if k.startswith("kvoffload_tier_rejected")) > 0
