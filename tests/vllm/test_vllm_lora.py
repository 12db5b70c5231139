"""A LoRA adapter retrained under the same name and path, served after a restart, never gets
the old adapter's KV from a persistent tier: the adapter's bytes are in its requests' keys
(vLLM's block hashes name an adapter by its name only)."""

import sys

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import vllm_job  # noqa: E402
from test_vllm_plugin import ktc, run_job  # noqa: E402


def test_a_retrained_adapter_under_the_same_name_is_never_served_the_old_adapters_kv(model, tmp_path):
    adapter = tmp_path / "adapter"
    lora = {"name": "support-bot", "path": str(adapter)}
    tiers = [{"medium": "cpu", "capacity": "64MiB"},
             {"medium": "disk", "path": str(tmp_path / "disk"), "capacity": "64MiB", "write_through": True}]
    job = {"model": model, "rounds": 1, "lora": lora}

    vllm_job.make_lora(str(adapter), seed=1)
    first = run_job({**job, "kv_transfer_config": ktc(tiers)})[0]
    assert first["cached"] == [0, 0, 0]
    again = run_job({**job, "kv_transfer_config": ktc(tiers)})[0]  # the same adapter: its blocks come back
    assert again["tokens"] == first["tokens"] and all(c >= 256 for c in again["cached"])

    vllm_job.make_lora(str(adapter), seed=2)  # retrained: same name, same path, same shapes
    expected = run_job(dict(job))[0]
    assert expected["tokens"] != first["tokens"]  # the adapter changes the output
    log: list[str] = []
    retrained = run_job({**job, "kv_transfer_config": ktc(tiers)}, log)[0]
    assert retrained["tokens"] == expected["tokens"]
    assert retrained["cached"] == [0, 0, 0]  # nothing of the old adapter's blocks was served
    assert any("LoRA adapter 'support-bot'" in line and "offload keys salted with adapter:" in line for line in log)
