"""The bundled engine end to end on a CUDA device: offload to CPU, and CPU + disk, serves the
same tokens as no offload while the prefixes really come back from the tiers."""

import pytest
import torch

from kvoffload.engine import LLM, EngineConfig
from kvoffload.workload import ChatWorkload, run_chat_workload

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

WORKLOAD = ChatWorkload(conversations=16, turns=3, system_tokens=128, user_tokens=64, max_tokens=12)
DEVICE_BLOCKS = 60  # the chats' working set is ~4x the device cache
BLOCK_BYTES = 8192  # the tiny model at block size 16 (float32)


def run(kv_offload=None):
    cfg = EngineConfig(num_gpu_blocks=DEVICE_BLOCKS, max_num_seqs=3, max_num_batched_tokens=256, device="cuda",
                       kv_offload=kv_offload)
    with LLM(cfg) as llm:
        assert llm.runner.kv_caches[0].is_cuda
        return run_chat_workload(llm, WORKLOAD), llm.stats()


@pytest.fixture(scope="module")
def baseline():
    return run()


def test_cpu_tier_on_cuda(baseline):
    tokens, stats = run({"tiers": [{"name": "cpu", "medium": "cpu", "capacity": "32MiB"}]})
    assert tokens == baseline[0]
    assert stats["prefix_hit_tokens"]["cpu"] > 0
    assert stats["transfer"]["host_to_device"]["failed"] == 0 and stats["transfer"]["device_to_host"]["failed"] == 0
    assert stats["prefill_tokens_computed"] <= 0.6 * baseline[1]["prefill_tokens_computed"]


def test_cpu_and_disk_tiers_on_cuda(baseline, tmp_path):
    tokens, stats = run({"tiers": [{"name": "cpu", "medium": "cpu", "capacity": 120 * BLOCK_BYTES},
                                   {"name": "ssd", "medium": "disk", "path": str(tmp_path), "capacity": "64MiB"}]})
    assert tokens == baseline[0]
    assert stats["prefix_hit_tokens"]["cpu"] > 0 and stats["prefix_hit_tokens"]["disk"] > 0
    assert all(d["failed"] == 0 for d in stats["transfer"].values())



def test_cpu_and_shared_fs_tiers_on_cuda_across_two_engines(baseline, tmp_path):
    """A second engine on the same fs directory loads the first one's blocks into CUDA memory."""
    tiers = [{"name": "cpu", "medium": "cpu", "capacity": 120 * BLOCK_BYTES},
             {"name": "shared", "medium": "fs", "path": str(tmp_path), "capacity": "64MiB"}]
    first, _ = run({"tiers": tiers})
    second, stats = run({"tiers": tiers})
    assert first == second == baseline[0]
    assert stats["prefix_hit_tokens"]["fs"] > 0
    assert all(d["failed"] == 0 for d in stats["transfer"].values())


HYBRID_PROMPTS = [[1 + (i * 7 + j * 13) % 250 for j in range(n)] for i, n in enumerate((40, 100, 200, 150))]


def _run_hybrid(kv_offload):
    from kvoffload.engine import SamplingParams

    cfg = EngineConfig(model="tiny-hybrid", block_size=8, num_gpu_blocks=400, max_num_batched_tokens=64,
                       device="cuda", kv_offload=kv_offload)
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    with LLM(cfg) as llm:
        assert all(t.is_cuda for t in llm.runner.kv_caches)
        first = [o.token_ids for o in llm.generate(HYBRID_PROMPTS, sp)]
        assert llm.reset_prefix_cache()  # round 2 can only hit the offload tier
        second = [o.token_ids for o in llm.generate(HYBRID_PROMPTS, sp)]
        return first, second, llm.stats()


def test_hybrid_sliding_window_model_on_cuda_loads_from_the_cpu_tier():
    """The hybrid (1 full + 3 sliding-window groups) model on CUDA: same tokens with a CPU tier,
    every whole prompt block served from it on the second round."""
    ref = _run_hybrid(None)
    first, second, stats = _run_hybrid({"tiers": [{"medium": "cpu", "capacity": "8MiB"}]})
    assert (first, second) == ref[:2]
    assert stats["external_hit_tokens"] == sum(len(p) // 8 * 8 for p in HYBRID_PROMPTS)
    assert all(d["failed"] == 0 for d in stats["transfer"].values())
