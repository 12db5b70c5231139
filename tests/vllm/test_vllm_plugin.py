"""kvoffload inside a real vLLM (CPU build): by name, by module path, with a disk tier, and as
the OffloadingSpec of vLLM's own OffloadingConnector.

Each job runs in a subprocess (vLLM spawns its engine process); the tiny random Llama is made
locally with transformers, nothing is downloaded. Prompts are 300 tokens: two full 128-token
vLLM blocks each.
"""

import fcntl
import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from kvoffload.testing.faults import flip_every_disk_record

try:
    from tests.vllm import forkserver
except ImportError:  # imported as a top-level module (its folder on sys.path)
    import forkserver  # type: ignore[no-redef]

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

JOB = Path(__file__).with_name("vllm_job.py")


def run_job(spec: dict, log: list | None = None) -> list[dict]:
    if "kv_transfer_config" not in spec and log is None and not spec.get("metrics") and os.environ.get(PLAIN_RUNS):
        return _plain_run(spec, Path(os.environ[PLAIN_RUNS]))
    return _run_job(spec, log)


#: Where plain vLLM's outputs are kept for the session (tests/vllm/conftest.py sets it).
PLAIN_RUNS = "KVOFFLOAD_TEST_PLAIN_RUNS"
_digests: dict[str, str] = {}


def _plain_run(spec: dict, where: Path) -> list[dict]:
    """Plain vLLM (no connector) is the reference most tests compare with, and the same job in
    every module that asks for it: it runs once a session (all xdist workers share the file; a
    job asking for fewer rounds gets the first rounds of a longer one, which are the same)."""
    model = spec["model"]
    if model not in _digests:
        h = hashlib.sha256(JOB.read_bytes())
        for f in sorted(Path(model).iterdir()):
            h.update(f.name.encode() + f.read_bytes())
        _digests[model] = h.hexdigest()
    rounds = spec.get("rounds", 2)
    same = {k: v for k, v in spec.items() if (k, v) != ("tp", 1)}  # tp 1 is the default
    key = json.dumps({**same, "model": _digests[model], "rounds": None}, sort_keys=True)
    path = where / hashlib.sha256(key.encode()).hexdigest()[:24]
    where.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits for the run, then reads it
        if path.exists():
            stored = json.loads(path.read_text())
            if len(stored) >= rounds:
                return stored[:rounds]
        result = _run_job({**spec, "rounds": max(rounds, 2)})
        path.write_text(json.dumps(result))
    return result[:rounds]


def _run_job(spec: dict, log: list | None = None) -> list[dict]:
    """One vLLM job in a subprocess. By default vLLM's engine core and its worker run inside it
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one vLLM import, not three; 15 s a job, not 32):
    the connector's halves are the same objects either way. Jobs that cross vLLM's process
    boundaries (connector metadata, results and stats pickled between engine core and worker)
    ask for ``"processes": True``; tensor-parallel jobs always do."""
    env = {**os.environ, **spec.pop("env", {})}
    if spec.pop("processes", False) or spec.get("tp", 1) > 1:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if spec.get("tp", 1) > 1:  # one OpenMP thread set per rank on vLLM's CPU backend
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(spec["tp"]))
    proc = forkserver.run(JOB, json.dumps(spec), env, timeout=600)
    if log is not None:
        log.extend(line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
                   if "kvoffload:" in line or "hybrid kv cache manager" in line)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"vLLM job failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")


def ktc(tiers, **extra):
    cfg = {"kv_connector": "KVOffloadConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"config": {"tiers": tiers}}}
    cfg["kv_connector_extra_config"].update(extra.pop("extra", {}))
    cfg.update(extra)
    return cfg


CPU = [{"medium": "cpu", "capacity": "64MiB"}]


@pytest.fixture(scope="session")
def plain(model):
    return run_job({"model": model})


@pytest.fixture(scope="session")
def by_name(model):
    """The connector by name over a CPU tier, two rounds and its counters: one vLLM start for
    the tests that read it, in vLLM's own processes (metadata, results and stats cross them)."""
    log: list[str] = []
    return run_job({"model": model, "kv_transfer_config": ktc(CPU), "metrics": ["kvoffload_"], "processes": True},
                   log), log


@pytest.mark.xdist_group("by_name")  # one worker, for by_name to start vLLM once
def test_by_name_serves_second_round_from_cpu_tier(by_name, plain):
    rounds, log = by_name
    # vLLM's CPU backend: one (num_blocks, 2, 128, 64) bf16 tensor per layer (K/V, block size 128,
    # 2 heads x 32); canonicalised to one block-major view per layer, 2 x 32 KiB per block.
    assert re.search(r"2 KV tensors like \(\d+, 2, 128, 64\) torch.bfloat16 -> 2 block views, 65536 bytes", "\n".join(log))
    assert rounds[0]["tokens"] == plain[0]["tokens"]
    assert rounds[1]["tokens"] == plain[1]["tokens"]
    assert all(c >= 256 for c in rounds[1]["cached"])  # after reset_prefix_cache: from kvoffload
    assert all(c == 0 for c in plain[1]["cached"])


def test_negative_control_corrupted_loads_change_outputs(model, plain):
    faulty = {"spec_name": "FaultyOffloadingSpec", "spec_module_path": "kvoffload.testing.faults"}
    rounds = run_job({"model": model, "kv_transfer_config": ktc(CPU, extra={"config": {"tiers": CPU, **faulty}}),
                      "env": {"KVOFFLOAD_FAULT_PLAN": '{"corrupt_loads": true}'}})
    assert all(c >= 256 for c in rounds[1]["cached"])
    assert rounds[1]["tokens"] != plain[1]["tokens"]


def test_module_path_route(model, plain):
    rounds = run_job({"model": model,
                      "kv_transfer_config": ktc(CPU, kv_connector_module_path="kvoffload.integrations.vllm")})
    assert rounds[1]["tokens"] == plain[1]["tokens"] and all(c >= 256 for c in rounds[1]["cached"])


def test_second_process_hits_first_process_disk_cache(model, plain, tmp_path):
    # A two-block CPU tier (one prompt): the first process demotes all but its last prompt to disk
    # (the CPU tier itself is not persisted), so a fresh process finds two prompts on disk.
    tiers = [{"medium": "cpu", "capacity": "128KiB"}, {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB"}]
    first = run_job({"model": model, "kv_transfer_config": ktc(tiers), "rounds": 1})
    assert all(c == 0 for c in first[0]["cached"])
    second = run_job({"model": model, "kv_transfer_config": ktc(tiers), "rounds": 1})
    assert second[0]["tokens"] == plain[0]["tokens"]
    assert sum(c >= 256 for c in second[0]["cached"]) >= 2


def test_tensor_parallel_restart_on_a_disk_tier_serves_each_rank_its_own_shard(model, tmp_path):
    # Both ranks once wrote one record file, so a restarted engine loaded rank 0's shard into
    # rank 1. Each rank now owns its own file; a record counts only if every rank's is intact.
    plain_tp = run_job({"model": model, "tp": 2, "rounds": 1})
    tiers = [{"medium": "cpu", "capacity": "8MiB"},
             {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB", "write_through": True}]
    first = run_job({"model": model, "tp": 2, "kv_transfer_config": ktc(tiers), "rounds": 1})
    assert first[0]["tokens"] == plain_tp[0]["tokens"]
    files = sorted(p.name for p in tmp_path.glob("*.kvdata"))
    assert len(files) == 2 and files[0].endswith("-rank0of2.kvdata") and files[1].endswith("-rank1of2.kvdata")
    second = run_job({"model": model, "tp": 2, "kv_transfer_config": ktc(tiers), "rounds": 1})
    assert second[0]["tokens"] == plain_tp[0]["tokens"]
    assert all(c >= 256 for c in second[0]["cached"])


def test_write_through_disk_tier_persists_everything_and_corrupt_records_are_recomputed(model, plain, tmp_path):
    # The usual shape: a CPU tier that holds the whole working set. With write_through every
    # stored block also goes to disk, so a fresh process hits all three prompts.
    tiers = [{"medium": "cpu", "capacity": "64MiB"},
             {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB", "write_through": True}]
    run_job({"model": model, "kv_transfer_config": ktc(tiers), "rounds": 1})
    second = run_job({"model": model, "kv_transfer_config": ktc(tiers), "rounds": 1})
    assert second[0]["tokens"] == plain[0]["tokens"]
    assert all(c >= 256 for c in second[0]["cached"])
    # Then every record on disk is flipped: the next process's loads all fail their checksum;
    # vLLM is told which blocks (get_block_ids_with_load_errors) and recomputes the requests
    # waiting for an asynchronous load (auto: a disk tier not yet timed).
    _corrupt_then_read(model, plain, tiers, tmp_path, "auto")


def test_corrupt_disk_records_under_layerwise_loads_are_recomputed(model, plain, tmp_path):
    # The requests that ran in the step of their layer-wise load recompute.
    tiers = [{"medium": "cpu", "capacity": "64MiB"},
             {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB", "write_through": True}]
    run_job({"model": model, "kv_transfer_config": ktc(tiers), "rounds": 1})
    _corrupt_then_read(model, plain, tiers, tmp_path, "layerwise")


def _corrupt_then_read(model, plain, tiers, path, mode):
    assert flip_every_disk_record(path) >= 6
    cfg = ktc(tiers, kv_load_failure_policy="recompute", extra={"config": {"tiers": tiers, "load_mode": mode}})
    log: list = []
    got = run_job({"model": model, "kv_transfer_config": cfg, "rounds": 1}, log)
    assert got[0]["tokens"] == plain[0]["tokens"]
    assert any("disk_to_device copy failed" in line and "checksum" in line for line in log)


@pytest.mark.parametrize("mode", ["layerwise", "async", "never-recompute"])
def test_load_modes_serve_identical_tokens_and_count_their_decisions(model, plain, mode, tmp_path):
    # layerwise: each hit is scheduled in the step that loads it, layer by layer inside vLLM's
    # forward pass (wait_for_layer_load), its stores copied out layer by layer (save_kv_layer);
    # async: it waits in WAITING_FOR_REMOTE_KVS and its stores start after the step, as before;
    # never-recompute, over an fs tier written through: host memory hits still load layer by layer.
    tiers = CPU if mode != "never-recompute" else [
        *CPU, {"medium": "fs", "path": str(tmp_path), "capacity": "64MiB", "write_through": True}]
    cfg = ktc(tiers, extra={"config": {"tiers": tiers, "load_mode": mode}})
    rounds = run_job({"model": model, "kv_transfer_config": cfg, "metrics": ["kvoffload_load_decisions"]})
    assert rounds[1]["tokens"] == plain[1]["tokens"]
    assert all(c >= 256 for c in rounds[1]["cached"])
    label = "layerwise" if mode == "never-recompute" else mode
    assert rounds[2]["metrics"] == {f"kvoffload_load_decisions_total{{decision={label},tier=cpu}}": 3.0}
    if mode == "never-recompute":  # every offloaded block written through: two per prompt, 3 prompts
        assert len(list(tmp_path.rglob("*.kv"))) >= 6


def test_bad_config_key_fails_startup_with_key_named(model):
    bad = ktc([{"medium": "cpu", "capacity": "64MiB", "colour": "red"}])
    with pytest.raises(AssertionError, match=r"tiers\[0\].colour: unknown key"):
        run_job({"model": model, "kv_transfer_config": bad, "rounds": 1})


def spec_route(tiers, **extra):
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": "KVOffloadSpec",
                                          "spec_module_path": "kvoffload.integrations.vllm_spec",
                                          "config": {"tiers": tiers}, **extra}}


@pytest.mark.parametrize("chunk_tokens", [128, 256])  # 256: vLLM offloads 2-block chunks
def test_offloading_spec_route_with_vllms_own_connector(model, plain, chunk_tokens):
    log: list[str] = []
    rounds = run_job({"model": model, "kv_transfer_config": spec_route(CPU, block_size=chunk_tokens)}, log)
    blocks = chunk_tokens // 128
    chunks = 64 * 2**20 // (65536 * blocks)  # the 64 MiB tier
    expected = f"2 vLLM block tensors -> 2 block views, 65536 bytes per block, {chunks} chunks of {blocks} blocks"
    assert any(expected in line for line in log), log
    assert rounds[0]["tokens"] == plain[0]["tokens"]
    assert rounds[1]["tokens"] == plain[1]["tokens"]
    assert all(c >= 256 for c in rounds[1]["cached"])


def test_offloading_spec_route_by_plugin_name(model, plain):
    # Also the KV-aware policy, live in vLLM: its tier serves the second round.
    cfg = spec_route([{**CPU[0], "eviction_policy": "prefix_value"}])
    del cfg["kv_connector_extra_config"]["spec_module_path"]  # the plugin registered "KVOffloadSpec"
    # In vLLM's own processes: this route's metadata and results cross them too.
    rounds = run_job({"model": model, "kv_transfer_config": cfg, "processes": True})
    assert all(c >= 256 for c in rounds[1]["cached"])
    assert rounds[1]["tokens"] == plain[1]["tokens"]


def test_offloading_spec_route_negative_control(model, plain):
    cfg = spec_route(CPU)
    cfg["kv_connector_extra_config"].update(spec_name="FaultyKVOffloadSpec",
                                            spec_module_path="kvoffload.testing.vllm_faults")
    rounds = run_job({"model": model, "kv_transfer_config": cfg})
    assert all(c >= 256 for c in rounds[1]["cached"])
    assert rounds[1]["tokens"] != plain[1]["tokens"]


@pytest.mark.xdist_group("by_name")  # one worker, for by_name to start vLLM once
def test_kvoffload_counters_reach_vllms_metrics(by_name):
    rounds, _ = by_name
    metrics = rounds[-1]["metrics"]
    cached = sum(rounds[1]["cached"])  # round 2 after reset_prefix_cache: every cached token came from the tier
    assert cached >= 3 * 256
    assert metrics["kvoffload_hit_tokens_total{tier=cpu}"] == cached
    assert metrics["kvoffload_stored_blocks_total{}"] >= 6 and metrics["kvoffload_loaded_blocks_total{}"] >= 6
    assert metrics["kvoffload_transfer_bytes_total{direction=device_to_host}"] > 0
    assert metrics["kvoffload_transfer_bytes_total{direction=host_to_device}"] == 65536 * (cached // 128)


def test_spec_route_feeds_vllms_own_offload_metrics(model):
    cfg = spec_route(CPU)
    cfg["kv_connector_extra_config"]["config"]["store_threshold"] = 2  # the skipped-store counter too
    rounds = run_job({"model": model, "kv_transfer_config": cfg, "metrics": ["vllm:kv_offload"], "rounds": 3})
    metrics = rounds[-1]["metrics"]
    # Round 1 offers every chunk once (the filter skips them: 3 prompts x 2 chunks), round 2 stores them.
    assert metrics["vllm:kv_offload_stores_skipped_total{}"] == 6
    assert metrics["vllm:kv_offload_cpu_allocation_size_count{}"] >= 3
    assert "vllm:kv_offload_cpu_cache_usage_perc{}" in metrics
    assert all(c >= 256 for c in rounds[2]["cached"])


@pytest.mark.parametrize("tiers", [CPU, "cpu+disk"])
def test_weights_updated_in_place_then_reset_serve_no_old_kv(model, tmp_path, tiers):
    """collective_rpc weight update + reset_prefix_cache(reset_connector=True): before the
    connector implemented reset_cache, the next round got 256 cached tokens of the old weights."""
    if tiers == "cpu+disk":
        tiers = [{"medium": "cpu", "capacity": "64MiB"},
                 {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB", "write_through": True}]
    rpc = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # collective_rpc with a function (test only)
    (fresh,) = run_job({"model": model, "rounds": 1, "new_weights_before": 0, "env": rpc})
    rounds = run_job({"model": model, "kv_transfer_config": ktc(tiers), "rounds": 3, "new_weights_before": 1,
                      "reset_connector": True, "env": rpc})
    assert rounds[1]["tokens"] == fresh["tokens"]
    assert all(c == 0 for c in rounds[1]["cached"])
    assert rounds[2]["tokens"] == fresh["tokens"] and all(c >= 256 for c in rounds[2]["cached"])


def test_cache_salt_separates_tenants_in_the_offload_tiers(model, plain, tmp_path):
    tiers = [{"medium": "cpu", "capacity": "64MiB"},
             {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB", "write_through": True}]
    rounds = run_job({"model": model, "kv_transfer_config": ktc(tiers), "rounds": 4,
                      "salts": ["tenant-a", "tenant-b", None, "tenant-a"]})
    assert [r["cached"] for r in rounds[:3]] == [[0, 0, 0]] * 3  # each round after a device reset
    assert all(c >= 256 for c in rounds[3]["cached"])  # the same tenant's blocks, from kvoffload
    assert all(r["tokens"] == plain[0]["tokens"] for r in rounds)


#: 8 prompts of 300 tokens (2 full vLLM blocks each, 128 KiB of KV).
DEGRADE_PROMPTS = [[(i * 53 + j) % 500 + 1 for j in range(300)] for i in range(8)]


@pytest.fixture(scope="session")
def degrade_plain(model):
    return run_job({"model": model, "prompts": DEGRADE_PROMPTS, "rounds": 4})


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_disk_that_slows_down_after_auto_timed_it_is_given_up_not_waited_for(model, degrade_plain, tmp_path, policy):
    """Round 1 times the disk (fast); from its 7th read on it serves 64 KB/s (a 2-block load:
    2 s; recomputing it: milliseconds). Round 2's loads planned on the old fit are given up once
    they run past recomputing and the requests recompute; round 3 recomputes outright. Under
    kv_load_failure_policy='fail' a load is never given up (it would fail its request): the
    requests wait for the slow loads, and are served."""
    tiers = [{"medium": "cpu", "capacity": "128KiB"},  # one prompt's blocks: the rest from disk
             {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB", "write_through": True,
              "max_store_ms_per_mib": 60000}]
    config = {"tiers": tiers, "spec_name": "ThrottledOffloadingSpec", "spec_module_path": "kvoffload.testing.throttle"}
    cfg = ktc(tiers, kv_load_failure_policy=policy, extra={"config": config})
    env = {"KVOFFLOAD_THROTTLE": "disk:64KB/s:0ms:after=6"}
    rounds = 4 if policy == "recompute" else 3
    plain = degrade_plain[:rounds]
    got = run_job({"model": model, "prompts": DEGRADE_PROMPTS, "rounds": rounds, "kv_transfer_config": cfg,
                   "env": env, "metrics": ["kvoffload_hit_tokens", "kvoffload_cancelled_load_blocks"]})
    assert [r["tokens"] for r in got[:rounds]] == [r["tokens"] for r in plain]
    metrics = got[-1]["metrics"]
    disk_hits = metrics.get("kvoffload_hit_tokens_total{tier=disk}", 0)
    cancelled = metrics.get("kvoffload_cancelled_load_blocks_total{}", 0)
    if policy == "recompute":
        assert cancelled > 0
        assert disk_hits <= 6 * 256  # the six fast reads' hits: none waited for the slow disk
    else:
        assert cancelled == 0 and disk_hits > 6 * 256  # slow loads waited for, none failed
