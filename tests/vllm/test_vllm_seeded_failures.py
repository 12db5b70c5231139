"""Seeded n=2 requests whose loads fail (every fs record flipped) under
kv_load_failure_policy=recompute, on vLLM's CPU build: the engine stays up and every sample
equals plain vLLM's. vLLM 0.32's CPU build kills the engine when a request with its own seed
has a prefill split over steps (``_bookkeeping_sync`` rewinds a CPU generator's offset, which
CPU generators lack: "CPU Generator does not use offset"), with or without a connector; a
failed load turns a one-token prefill into a whole one, which a busy step splits. So kvoffload
warns at start on that combination, and the documented policy (chunked prefill off) runs here."""

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from tests.vllm.test_vllm_plugin import ktc, run_job  # noqa: E402

PROMPTS = [[(i * 53 + j * 7) % 500 + 1 for j in range(300)] for i in range(4)]
SEEDED = {"rounds": 1, "prompts": PROMPTS, "max_tokens": 6, "temperature": 1.0, "seed": 7, "n": 2,
          "ignore_eos": True}
NO_SPLIT = {"enable_chunked_prefill": False, "max_num_batched_tokens": 1024}  # >= max_model_len


def _flip_every_record(root) -> int:
    records = sorted(root.rglob("*.kv"))
    for path in records:
        raw = bytearray(path.read_bytes())
        for i in range(200, len(raw), 4096):
            raw[i] ^= 0x5A
        path.write_bytes(bytes(raw))
    return len(records)


def test_failed_loads_of_seeded_n2_requests_recompute_identical_samples(model, tmp_path):
    tiers = [{"medium": "cpu", "capacity": "64MiB"}, {"medium": "fs", "path": str(tmp_path / "fs"), "capacity": "64MiB"}]
    # never-recompute: every hit tries its load (auto times the fs tier one load at a time first)
    kv = ktc(tiers, kv_load_failure_policy="recompute",
             extra={"config": {"tiers": tiers, "load_mode": "never-recompute"}})
    expected = run_job({"model": model, **SEEDED, **NO_SPLIT})[0]["samples"]
    assert all(len(s) == 2 and s[0] != s[1] for s in expected)  # two different samples per prompt

    log: list[str] = []
    stored = run_job({"model": model, **SEEDED, "kv_transfer_config": kv}, log)[0]  # chunked prefill on
    assert stored["samples"] == expected
    assert any("CPU Generator does not use offset" in line and "--no-enable-chunked-prefill" in line for line in log)
    assert _flip_every_record(tmp_path / "fs") >= 4  # at least one offloaded block per prompt

    replay = run_job({"model": model, **SEEDED, **NO_SPLIT, "kv_transfer_config": kv,
                      "metrics": ["kvoffload_tier_rejected", "kvoffload_failed_hit"]})
    assert replay[0]["samples"] == expected  # the engine stayed up, every sample as plain vLLM's
    metrics = replay[1]["metrics"]
    rejected = sum(v for k, v in metrics.items() if k.startswith("kvoffload_tier_rejected_blocks_total"))
    failed = sum(v for k, v in metrics.items() if k.startswith("kvoffload_failed_hit_tokens_total"))
    assert rejected >= 4 and failed >= 4 * 256, metrics  # the loads were tried and failed, then recomputed
