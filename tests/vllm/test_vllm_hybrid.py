"""A hybrid model (Gemma 3 shaped: 3 sliding-window layers with window 64, 1 full-attention layer)
in a real vLLM with its hybrid allocator on: kvoffload's connector is SupportsHMA, so vLLM keeps
one window per sliding group, and the offloaded prefix is served from our tiers (sliding groups
load just the window before the hit's end) with the same tokens as plain vLLM."""

import subprocess
import sys

import pytest

from tests.vllm.test_vllm_plugin import JOB, ktc, run_job, spec_route

# One worker runs the module (CI: --dist loadgroup), for its plain-run fixture to start vLLM once.
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("hybrid")]
pytest.importorskip("vllm")


@pytest.fixture(scope="session")
def gemma3(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-gemma3")
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(JOB.parent)!r}); "
                    f"import vllm_job; vllm_job.make_gemma3({str(path)!r})"], check=True)
    return str(path)


@pytest.fixture(scope="session")
def plain(gemma3):
    log: list[str] = []
    rounds = run_job({"model": gemma3, "dtype": "float32"}, log)
    assert not any("Turning off hybrid kv cache manager" in line for line in log)
    return rounds


@pytest.mark.parametrize("disk", [False, True], ids=["cpu", "cpu+disk"])
def test_hybrid_model_keeps_vllms_hybrid_allocator_and_is_served_from_kvoffload(gemma3, plain, tmp_path, disk):
    tiers = [{"medium": "cpu", "capacity": "64MiB"}]
    if disk:
        tiers.append({"medium": "disk", "path": str(tmp_path), "capacity": "64MiB", "write_through": True})
    log: list[str] = []
    rounds = run_job({"model": gemma3, "dtype": "float32", "kv_transfer_config": ktc(tiers)}, log)
    assert not any("Turning off hybrid kv cache manager" in line for line in log), log
    assert rounds[0]["tokens"] == plain[0]["tokens"]
    assert rounds[1]["tokens"] == plain[1]["tokens"]
    assert all(c >= 256 for c in rounds[1]["cached"])  # after reset_prefix_cache: from kvoffload
    assert all(c == 0 for c in plain[1]["cached"])


@pytest.mark.parametrize("chunk_tokens", [128, 256])  # 256: vLLM offloads 2-block chunks, per group
def test_hybrid_model_on_the_offloading_spec_route(gemma3, plain, chunk_tokens):
    log: list[str] = []
    tiers = [{"medium": "cpu", "capacity": "64MiB"}]
    rounds = run_job({"model": gemma3, "dtype": "float32",
                      "kv_transfer_config": spec_route(tiers, block_size=chunk_tokens)}, log)
    assert not any("Turning off hybrid kv cache manager" in line for line in log), log
    assert rounds[1]["tokens"] == plain[1]["tokens"] and all(c >= 256 for c in rounds[1]["cached"])


def test_negative_control_corrupted_hybrid_loads_change_outputs(gemma3, plain):
    faulty = {"spec_name": "FaultyOffloadingSpec", "spec_module_path": "kvoffload.testing.faults"}
    cpu = [{"medium": "cpu", "capacity": "64MiB"}]
    rounds = run_job({"model": gemma3, "dtype": "float32",
                      "kv_transfer_config": ktc(cpu, extra={"config": {"tiers": cpu, **faulty}}),
                      "env": {"KVOFFLOAD_FAULT_PLAN": '{"corrupt_loads": true}'}})
    assert all(c >= 256 for c in rounds[1]["cached"])
    assert rounds[1]["tokens"] != plain[1]["tokens"]
