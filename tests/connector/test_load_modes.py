"""Load modes end to end on the bundled engine: the cost model recomputes a throttled tier's
hits and loads host memory's, every mode serves identical tokens."""

from __future__ import annotations

import logging

import pytest

from kvoffload.engine import LLM, EngineConfig
from kvoffload.testing.faults import flip_every_disk_record
from kvoffload.testing.throttle import ThrottledOffloadingSpec, parse_throttles
from kvoffload.workload import ChatWorkload, run_chat_workload

WORKLOAD = ChatWorkload(conversations=10, turns=3, system_tokens=96, user_tokens=64, max_tokens=8)


def offload(tmp_path, mode: str, cpu: str = "384KiB", throttle: bool = True, store_ms_per_mib: float | None = None) -> dict:
    disk: dict = {"medium": "disk", "capacity": "64MiB", "path": str(tmp_path / mode)}
    if store_ms_per_mib is not None:
        disk["max_store_ms_per_mib"] = store_ms_per_mib
    cfg: dict = {"load_mode": mode, "tiers": [{"medium": "cpu", "capacity": cpu}, disk]}
    if throttle:
        cfg.update(spec_name="ThrottledOffloadingSpec", spec_module_path="kvoffload.testing.throttle")
    return cfg


#: Longer chats: more returning turns reach the throttled disk after its warm-up.
LONG = ChatWorkload(conversations=10, turns=5, system_tokens=96, user_tokens=64, max_tokens=8)


def run(kv_offload: dict | None, workload: ChatWorkload = WORKLOAD) -> tuple[list, dict]:
    cfg = EngineConfig(num_gpu_blocks=40, max_num_seqs=2, max_num_batched_tokens=256, kv_offload=kv_offload)
    with LLM(cfg) as llm:
        return run_chat_workload(llm, workload), llm.stats()


@pytest.fixture(scope="module")
def baseline():
    return run(None)


@pytest.fixture(scope="module")
def long_baseline():
    return run(None, LONG)


@pytest.fixture()
def slow_disk(monkeypatch):
    monkeypatch.delenv("KVOFFLOAD_THROTTLE", raising=False)
    monkeypatch.setattr(ThrottledOffloadingSpec, "throttles", parse_throttles("disk:20MB/s:30ms"))


def test_auto_recomputes_a_throttled_tier_and_loads_host_memory(tmp_path, long_baseline, slow_disk, caplog):
    caplog.set_level(logging.DEBUG, logger="kvoffload.connector.scheduler.load_planner")
    tokens, stats = run(offload(tmp_path, "auto"), LONG)
    assert tokens == long_baseline[0]
    decisions = stats["connector"]["load_decisions"]
    # Disk hits: the first few loaded (asynchronously) while the tier is timed, then recomputed
    # (or only their host-memory head loaded); host-memory-only hits loaded layer by layer.
    disk = decisions["disk"]
    assert disk.get("recompute", 0) + disk.get("partial", 0) >= 3, decisions
    assert "layerwise" not in disk, decisions
    assert decisions["cpu"]["layerwise"] >= 3 and set(decisions["cpu"]) == {"layerwise"}, decisions
    assert stats["prefix_hit_tokens"]["cpu"] > 0
    gauges = stats["connector"]["load_cost"]
    # 20 MB/s and 30 ms a job, measured (the warm-up's jobs were alike in size, so the fit folds
    # the latency into the rate).
    assert 0 < gauges["kvoffload_tier_load_bytes_per_second"]["disk"] < 20e6
    assert gauges["kvoffload_tier_load_bytes_per_second"]["cpu"] > gauges["kvoffload_tier_load_bytes_per_second"].get(
        "disk", 0)
    lines = [r.getMessage() for r in caplog.records if "estimated load" in r.getMessage()]
    assert any("reaching disk: recompute 0 of them (measured" in line for line in lines), lines[:5]


def test_never_recompute_loads_every_disk_hit(tmp_path, baseline, slow_disk):
    # The disk's backpressure would skip stores that queue behind 30 ms jobs on a busy machine
    # (fewer blocks reach the disk, fewer hits): this test is about loads, so stores all land.
    tokens, stats = run(offload(tmp_path, "never-recompute", store_ms_per_mib=60_000))
    assert tokens == baseline[0]
    decisions = stats["connector"]["load_decisions"]
    assert set(decisions["disk"]) == {"async"} and decisions["disk"]["async"] >= 3  # 30 ms a job: longer than a step
    assert stats["prefix_hit_tokens"]["disk"] > 0
    assert not stats["connector"]["tier_stores_skipped"], stats["connector"]["tier_stores_skipped"]


@pytest.mark.parametrize("mode", ["auto", "layerwise", "async", "never-recompute"])
@pytest.mark.parametrize("tiers", ["cpu", "cpu+disk", "cpu+fs"])
def test_every_mode_serves_identical_tokens(tmp_path, baseline, mode, tiers):
    cfg = offload(tmp_path, mode, throttle=False)
    if tiers == "cpu":
        cfg["tiers"] = cfg["tiers"][:1]
    elif tiers == "cpu+fs":
        cfg["tiers"][1] = {"medium": "fs", "capacity": "64MiB", "path": str(tmp_path / "fs")}
    tokens, stats = run(cfg)
    assert tokens == baseline[0]
    assert stats["prefix_hit_tokens"]["cpu"] > 0
    if tiers != "cpu" and mode != "auto":  # auto may recompute the second tier's hits; the others load them
        assert stats["prefix_hit_tokens"][tiers[4:]] > 0


def test_hits_loaded_on_measurements_count_the_prefill_they_saved(tmp_path, baseline):
    tokens, stats = run(offload(tmp_path, "auto", cpu="8MiB", throttle=False))
    assert tokens == baseline[0]
    decisions = stats["connector"]["load_decisions"]
    assert set(decisions) == {"cpu"} and decisions["cpu"]["layerwise"] > 3, decisions  # past the warm-up
    assert stats["connector"]["estimated_saved_seconds"] > 0


def test_a_layerwise_load_of_corrupt_records_recomputes_exactly_the_requests_that_read_them(tmp_path, baseline):
    # The first engine writes every block through to disk; the second starts with an empty
    # host tier, so its hits come from disk, layer by layer, and every record fails its checksum.
    cfg = offload(tmp_path, "layerwise", cpu="8MiB", throttle=False)
    cfg["tiers"][1]["write_through"] = True
    run(cfg)
    assert flip_every_disk_record(tmp_path / "layerwise") >= 10
    tokens, stats = run(cfg)
    assert tokens == baseline[0]
    c = stats["connector"]
    assert c["load_decisions"]["disk"]["layerwise"] >= 1
    assert c["tier_rejected_blocks"]["disk"]["checksum"] >= 1
    assert stats["failed_loads"] >= 1  # requests rolled back to their first unfilled block
    assert c["failed_store_blocks"] >= 1  # what those steps computed on the unfilled blocks was not stored


def test_a_failed_layerwise_load_drops_the_steps_whole_stores_too(tmp_path, baseline, monkeypatch):
    """Where stores go whole after the step (CUDA, hybrid caches), a step whose layer-wise load
    failed submits none of them: they may hold KV computed on the unfilled blocks."""
    from kvoffload.transfer.device_host_handler import DeviceHostHandler

    cfg = offload(tmp_path, "layerwise", cpu="8MiB", throttle=False)
    cfg["tiers"][1]["write_through"] = True
    run(cfg)
    assert flip_every_disk_record(tmp_path / "layerwise") >= 10
    opened = []
    monkeypatch.setattr(DeviceHostHandler, "open_layered_store", lambda self, job_id, spec: opened.append(job_id) or False)
    tokens, stats = run(cfg)
    assert tokens == baseline[0]
    assert opened  # every store was offered layer by layer, and went whole
    c = stats["connector"]
    assert c["load_decisions"]["disk"]["layerwise"] >= 1 and stats["failed_loads"] >= 1
    assert c["failed_store_blocks"] >= 1
