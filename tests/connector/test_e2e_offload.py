"""End to end on the bundled engine: multi-turn chats whose prefixes outgrow the device cache."""

import pytest
import torch

from kvoffload.engine import LLM, EngineConfig
from kvoffload.workload import ChatWorkload, run_chat_workload

WORKLOAD = ChatWorkload(conversations=16, turns=3, system_tokens=128, user_tokens=64, max_tokens=12)
DEVICE_BLOCKS = 60  # 960 tokens; the chats' working set is ~4x that


# The reuse filter stores a block on its second sighting, so turn 1's prefix only pays off
# from turn 3 on: give it more turns to amortise.
LONG_WORKLOAD = ChatWorkload(conversations=16, turns=6, system_tokens=128, user_tokens=32, max_tokens=12)


def run(kv_offload=None, workload=WORKLOAD, **kw):
    cfg = EngineConfig(num_gpu_blocks=DEVICE_BLOCKS, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=kv_offload, **kw)
    with LLM(cfg) as llm:
        tokens = run_chat_workload(llm, workload)
        return tokens, llm.stats()


_BASELINES: dict = {}


def baseline_for(workload):
    if workload not in _BASELINES:
        unique = workload.system_tokens + workload.conversations * workload.turns * (workload.user_tokens + workload.max_tokens)
        assert unique >= 3.5 * DEVICE_BLOCKS * 16  # the working set really outgrows the device
        _BASELINES[workload] = run(workload=workload)
    return _BASELINES[workload]


@pytest.fixture(scope="module")
def baseline():
    return baseline_for(WORKLOAD)


def cpu_tier(**extra):
    cfg = {"tiers": [{"name": "cpu", "medium": "cpu", "capacity": "32MiB", "eviction_policy": extra.pop("policy", "lru")}]}
    cfg.update(extra)
    return cfg


@pytest.mark.parametrize(
    "offload",
    [cpu_tier(), cpu_tier(offloaded_block_size=32), cpu_tier(offloaded_block_size=64),
     cpu_tier(store_threshold=2), cpu_tier(policy="arc")],
    ids=["lru", "factor2", "factor4", "reuse-filter", "arc"],
)
def test_offload_serves_evicted_prefixes_with_identical_outputs(offload):
    workload = LONG_WORKLOAD if offload.get("store_threshold") else WORKLOAD
    base_tokens, base_stats = baseline_for(workload)
    tokens, stats = run(offload, workload)
    assert tokens == base_tokens
    assert stats["prefix_hit_tokens"]["cpu"] > 0
    assert stats["connector"]["loaded_blocks"] > 0
    computed = stats["prefill_tokens_computed"]
    assert computed <= 0.6 * base_stats["prefill_tokens_computed"], (  # here 3,520 of 6,848 (0.51)
        f"computed {computed} of {base_stats['prefill_tokens_computed']}; decisions "
        f"{stats['connector'].get('load_decisions')}, hits {stats['prefix_hit_tokens']}")
    assert stats["transfer"]["host_to_device"]["failed"] == 0
    if offload.get("store_threshold"):
        assert stats["connector"]["filter_skipped_blocks"] > 0


def test_every_loaded_block_is_byte_identical_to_what_was_stored(monkeypatch):
    """Recorded at the copy kernel, so whole-job and layer-by-layer stores are both seen: each
    (host row, KV view) a load reads holds the bytes its store copied out of the device."""
    from kvoffload.transfer import device_host_handler as dh
    from kvoffload_ext.copies import RowTable

    stored: dict[tuple[int, int], bytes] = {}  # (host column view's address, host row) -> bytes
    checked = []
    original = RowTable.copy
    device_ptrs: set[int] = set()
    num_views = []

    def recording_copy(self, src_ids, dst_ids):
        original(self, src_ids, dst_ids)
        for src, dst in self.pairs:
            store = src.data_ptr() in device_ptrs
            host, rows, dev_view, devs = (dst, dst_ids, src, src_ids) if store else (src, src_ids, dst, dst_ids)
            for row, dev in zip(rows.tolist(), devs.tolist()):
                key = (host.data_ptr(), row)
                if store:
                    stored[key] = dev_view[dev].numpy().tobytes()
                else:
                    assert dev_view[dev].numpy().tobytes() == stored[key], f"device block {dev} differs from host row {row}"
                    checked.append(key)

    original_init = dh.DeviceHostHandler.__init__

    def init(self, kv, *args, **kwargs):
        original_init(self, kv, *args, **kwargs)
        device_ptrs.update(v.data_ptr() for v in kv.views)
        num_views.append(len(kv.views))

    monkeypatch.setattr(RowTable, "copy", recording_copy)
    monkeypatch.setattr(dh.DeviceHostHandler, "__init__", init)
    _, stats = run(cpu_tier(offloaded_block_size=32))
    assert len(checked) == stats["connector"]["loaded_blocks"] * 2 * num_views[0] > 0


def test_negative_control_corrupted_loads_change_outputs(baseline, monkeypatch):
    from kvoffload.testing.faults import FaultScript, FaultyOffloadingSpec

    monkeypatch.setattr(FaultyOffloadingSpec, "script", FaultScript(corrupt_loads=True))
    tokens, stats = run(cpu_tier(spec_name="FaultyOffloadingSpec", spec_module_path="kvoffload.testing.faults"))
    assert stats["prefix_hit_tokens"]["cpu"] > 0
    assert tokens != baseline[0]


def test_run_cli_reports_side_by_side(capsys):
    from kvoffload.cli import main

    rc = main(["run", "--config", "examples/cpu.yaml", "--conversations", "6", "--turns", "2", "--num-gpu-blocks", "48",
               "--system-tokens", "128", "--user-tokens", "32", "--max-tokens", "8", "--max-num-seqs", "3"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "outputs identical to the run without offload: yes" in out
    assert "prefix hits (cpu)" in out and "TTFT p95 (ms)" in out


def test_bad_offload_config_fails_engine_startup():
    from kvoffload.config import ConfigError

    with pytest.raises(ConfigError, match=r"tiers\[0\].capacity"):
        LLM(EngineConfig(kv_offload={"tiers": [{"medium": "cpu", "capacity": "lots"}]}))
    with pytest.raises(ConfigError, match="offloaded_block_size: 24 is not a multiple"):
        LLM(EngineConfig(kv_offload={"offloaded_block_size": 24, "tiers": [{"medium": "cpu", "capacity": "1MiB"}]}))


assert torch  # torch is needed by the monkeypatched page reader
