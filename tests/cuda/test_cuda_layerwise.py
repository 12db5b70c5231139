"""Layer-wise loads and stores on a real GPU: each layer of a load job gets a CUDA event on the
copy stream, the compute stream waits for its own layer only (the host never blocks), and the
bundled engine on CUDA serves identical tokens in every load mode. Skips cleanly without CUDA."""

import time

import pytest
import torch

from kvoffload.engine import LLM, EngineConfig
from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.testing.faults import flip_every_disk_record
from kvoffload.transfer.device_host_handler import DeviceHostHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.result import HOST_TO_DEVICE
from kvoffload.transfer.streams import CUDAStreamPool
from kvoffload.workload import ChatWorkload, run_chat_workload

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

LAYERS, BLOCKS, ROW = 16, 128, 128 << 10  # 16 layers x K,V x 128 blocks of 128 KiB: 512 MiB a load


def big_handler():
    layers = [torch.zeros(2, BLOCKS, ROW, dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    kv = canonicalize({f"model.layers.{i}.self_attn": t for i, t in enumerate(layers)}, BLOCKS)
    host = HostBlockBuffer(BLOCKS, kv.page_bytes, pin=True)
    for chunk in host.chunks:
        chunk.copy_(torch.randint(1, 256, chunk.shape, dtype=torch.uint8))  # no zero byte: a stale read shows
    pool = CUDAStreamPool(torch.device("cuda"), 2)
    return DeviceHostHandler(kv, host, 1, pool), layers, pool


def test_each_layer_is_waited_for_alone_and_layer_zero_computes_while_later_layers_copy():
    handler, layers, pool = big_handler()
    ids = list(range(BLOCKS))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    assert handler.transfer_async(1, (CPULoadStoreSpec(ids), GPULoadStoreSpec(ids)))
    progress = handler.layer_progress(1)
    issued = time.perf_counter() - t0
    assert progress is not None and progress.cuda
    job_end = pool._last[HOST_TO_DEVICE]
    compute = torch.cuda.current_stream()
    seen, marks = [], []
    t0 = time.perf_counter()
    for layer in range(LAYERS):
        progress.wait(layer)  # the compute stream waits for this layer's event, the host does not
        seen.append(layers[layer][:, :4].clone())  # "attention" reads the layer on the compute stream
        mark = torch.cuda.Event(enable_timing=True)
        mark.record(compute)
        marks.append(mark)
    waited = time.perf_counter() - t0
    marks[0].synchronize()
    assert not job_end.query(), "layer 0 was readable only once the whole job had landed"
    torch.cuda.synchronize()
    assert issued < 0.1 and waited < 0.1, f"the host blocked: {issued * 1e3:.1f} ms to issue, {waited * 1e3:.1f} to wait"
    for layer in range(LAYERS):  # every read saw its layer's loaded bytes (the host rows have no zero byte)
        assert bool((layers[layer] != 0).all()), f"layer {layer} was not loaded whole"
        assert torch.equal(seen[layer], layers[layer][:, :4]), f"layer {layer} was read before it landed"
    spread = marks[0].elapsed_time(marks[-1])
    (result,) = handler.get_finished()
    assert result.success and result.direction == HOST_TO_DEVICE
    # Layer 0's reader ran most of a job earlier than the last layer's: the waits are per layer.
    assert spread > 0.5 * result.seconds * 1e3 * (LAYERS - 2) / LAYERS, (spread, result.seconds)
    handler.close()


WORKLOAD = ChatWorkload(conversations=12, turns=3, system_tokens=128, user_tokens=64, max_tokens=12)


def run(kv_offload=None, workload=WORKLOAD):
    cfg = EngineConfig(num_gpu_blocks=48, max_num_seqs=3, max_num_batched_tokens=256, device="cuda",
                       kv_offload=kv_offload)
    with LLM(cfg) as llm:
        assert llm.runner.kv_caches[0].is_cuda
        return run_chat_workload(llm, workload), llm.stats()


@pytest.fixture(scope="module")
def baseline():
    return run()


def offload(tmp_path, mode, tiers, cpu="512KiB"):
    cfg = {"load_mode": mode, "tiers": [{"name": "cpu", "medium": "cpu", "capacity": cpu}]}
    if tiers != "cpu":
        cfg["tiers"].append({"name": "second", "medium": tiers[4:], "capacity": "64MiB", "path": str(tmp_path / mode)})
    return cfg


@pytest.mark.parametrize("mode", ["auto", "layerwise", "async", "never-recompute"])
@pytest.mark.parametrize("tiers", ["cpu", "cpu+disk", "cpu+fs"])
def test_every_load_mode_on_cuda_serves_identical_tokens(tmp_path, baseline, mode, tiers):
    tokens, stats = run(offload(tmp_path, mode, tiers))
    assert tokens == baseline[0]
    assert stats["prefix_hit_tokens"]["cpu"] > 0
    decisions = stats["connector"]["load_decisions"]
    if mode in ("auto", "layerwise", "never-recompute"):
        assert decisions["cpu"].get("layerwise", 0) >= 3, decisions  # host memory: inside the step
    else:
        assert set(decisions["cpu"]) == {"async"}, decisions
    if mode == "layerwise" and tiers != "cpu":
        assert decisions[tiers[4:]].get("layerwise", 0) >= 1, decisions
    assert all(d["failed"] == 0 for d in stats["transfer"].values()), stats["transfer"]


def test_a_layerwise_load_of_corrupt_records_on_cuda_recomputes_the_requests_that_read_them(tmp_path, baseline):
    cfg = offload(tmp_path, "layerwise", "cpu+disk", cpu="8MiB")
    cfg["tiers"][1]["write_through"] = True
    run(cfg)
    assert flip_every_disk_record(tmp_path / "layerwise") >= 10
    tokens, stats = run(cfg)  # an empty host tier: every hit reads disk, layer by layer, and fails its check
    assert tokens == baseline[0]
    c = stats["connector"]
    assert c["load_decisions"]["disk"]["layerwise"] >= 1
    assert c["tier_rejected_blocks"]["disk"]["checksum"] >= 1
    assert stats["failed_loads"] >= 1
