"""Two real vLLM processes (CPU build, KVOffloadConnector) share prefixes through one Mooncake
master: the second process's first round is served from the shared tier, token for token."""

import pytest

from kvoffload.testing.mooncake_master import MooncakeMaster, mooncake_binary
from tests.vllm.test_vllm_plugin import ktc, run_job

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("mooncake.store", exc_type=ImportError, reason="pip install 'kvoffload[mooncake]'; apt-get install -y libibverbs1 librdmacm1")
if mooncake_binary("mooncake_master") is None:
    pytest.skip("mooncake_master not found", allow_module_level=True)


@pytest.fixture
def master(tmp_path):
    with MooncakeMaster(str(tmp_path)) as m:
        m.segment_holder("256MB")  # outlives each vLLM process
        yield m


def _tiers(master):
    return [{"medium": "cpu", "capacity": "64MiB"}, master.tier(segment=0, local_buffer="32MiB")]


def _config(master):
    """The tiers, every hit loaded: the test is about sharing, not the cost model. Recomputing
    this tiny model's 256 tokens takes milliseconds, and a Mooncake read on a busy 2-core CI
    machine can take longer: CI once saw [256, 256, 0] cached (our reading: ``auto`` gave the
    tier up and recomputed the third prompt, as it should there)."""
    tiers = _tiers(master)
    return ktc(tiers, extra={"config": {"tiers": tiers, "load_mode": "never-recompute"}})


@pytest.mark.parametrize("tp", [1, 2])
def test_second_vllm_process_is_served_from_the_shared_tier(model, master, tp):
    plain = run_job({"model": model, "rounds": 1, "tp": tp})
    assert master.alive(), master.log_tail()
    first = run_job({"model": model, "kv_transfer_config": _config(master), "rounds": 1, "tp": tp})
    assert first[0]["tokens"] == plain[0]["tokens"] and all(c == 0 for c in first[0]["cached"])
    second = run_job({"model": model, "kv_transfer_config": _config(master), "rounds": 1, "tp": tp})
    assert second[0]["tokens"] == plain[0]["tokens"]
    assert all(c >= 256 for c in second[0]["cached"]), second[0]["cached"]
