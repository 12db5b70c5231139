"""KVOffloadWorker's copies against vLLM's canonical KV caches (byte-identical round trips, two
KV-cache groups on one tensor), and the spec route's config: its errors name the key, and the
packaged examples load by name. Without starting an engine."""

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

from kvoffload.config import ConfigError, OffloadConfig  # noqa: E402
from kvoffload.integrations.vllm_spec import check_config  # noqa: E402
from kvoffload.integrations.vllm_worker import KVOffloadWorker  # noqa: E402


@pytest.mark.parametrize("skip", [0, 1])
def test_worker_round_trip_is_byte_identical(skip):
    torch.manual_seed(0)
    layers = [torch.randn(10, 2, 4, 8, dtype=torch.bfloat16) for _ in range(2)]  # (blocks, K/V, tokens, dim)
    page = layers[0][0].numel() * 2
    tensors = [CanonicalKVCacheTensor(t.view(torch.int8).view(10, page), page) for t in layers]
    refs = [[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]]
    worker = KVOffloadWorker(CanonicalKVCaches(tensors, refs), blocks_per_chunk=2, num_chunks=4, backend="cpu")
    before = [t.clone() for t in layers]
    # Store device blocks 3,4,5,6 into chunks 2 and 0 (two blocks each).
    worker.submit_store(1, GPULoadStoreSpec([3, 4, 5, 6], [4], [0]), CPULoadStoreSpec([2, 0]))
    worker.wait({1})
    for t in layers:
        t.zero_()
    # Load them back into other blocks, skipping `skip` leading blocks of the first chunk.
    dst = [9, 0, 1, 2][: 4 - skip]
    worker.submit_load(2, CPULoadStoreSpec([2, 0]), GPULoadStoreSpec(dst, [4 - skip], [skip]))
    worker.wait({2})
    results = {r.job_id: r for r in worker.get_finished()}
    assert results[1].success and results[2].success and results[2].transfer_size == (4 - skip) * 2 * page
    for t, b in zip(layers, before):
        assert torch.equal(t[dst].view(torch.int16), b[[3, 4, 5, 6][skip:]].view(torch.int16))
    worker.shutdown()


def test_worker_round_trip_of_two_kv_cache_groups_sharing_one_tensor():
    """A hybrid model: two groups overlay one tensor (a block id is one group's); a job carries
    both groups' blocks (group_sizes) with each group's first block index, so each group skips
    its own leading blocks of its first chunk."""
    torch.manual_seed(0)
    shared = torch.randn(12, 2, 4, 8, dtype=torch.bfloat16)
    page = shared[0].numel() * 2
    tensors = [CanonicalKVCacheTensor(shared.view(torch.int8).view(12, page), page)]
    refs = [[CanonicalKVCacheRef(0, page)], [CanonicalKVCacheRef(0, page)]]
    worker = KVOffloadWorker(CanonicalKVCaches(tensors, refs), blocks_per_chunk=2, num_chunks=6, backend="cpu")
    before = shared.clone()
    # Group 0: blocks 1,2,3,4 -> chunks 0,1; group 1 (a window): blocks 7,8 -> chunk 2.
    worker.submit_store(1, GPULoadStoreSpec([1, 2, 3, 4, 7, 8], [4, 2], [0, 2]), CPULoadStoreSpec([0, 1, 2]))
    worker.wait({1})
    shared.zero_()
    # Load back: group 0 from its second block on (index 1: skip one), group 1 from index 3.
    worker.submit_load(2, CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([5, 6, 9, 10], [3, 1], [1, 3]))
    worker.wait({2})
    assert all(r.success for r in worker.get_finished())
    assert torch.equal(shared[[5, 6, 9]].view(torch.int16), before[[2, 3, 4]].view(torch.int16))
    assert torch.equal(shared[10].view(torch.int16), before[8].view(torch.int16))
    with pytest.raises(ValueError, match=r"the GPU and host specs disagree"):
        worker.submit_load(3, CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([5, 6, 9], [2, 1], [0, 0]))
    worker.shutdown()


@pytest.mark.parametrize(("raw", "extra", "message"), [
    ({"tiers": [{"medium": "cpu", "capacity": "1GiB"}, {"medium": "disk", "path": "/tmp", "capacity": "1GiB"}]},
     {}, r"tiers: KVOffloadSpec serves exactly one CPU tier"),
    ({"tiers": [{"medium": "cpu", "capacity": "1GiB"}], "offloaded_block_size": 256}, {},
     r"offloaded_block_size: .* set \"block_size\""),
    ({"tiers": [{"medium": "cpu", "capacity": "1GiB"}]}, {"cpu_bytes_to_use": 1 << 30},
     r"kv_connector_extra_config.cpu_bytes_to_use"),
])
def test_spec_config_errors_name_the_key(raw, extra, message):
    with pytest.raises(ConfigError, match=message):
        check_config(OffloadConfig.from_dict(raw), extra)


def test_tiers_need_a_dict_config():
    from kvoffload.integrations.vllm import load_extra_config

    with pytest.raises(ConfigError, match="needs \"config_file\""):
        load_extra_config({})
    cfg = load_extra_config({"config": {"tiers": [{"medium": "cpu", "capacity": "1KiB"}]}})
    assert cfg.tiers[0].capacity_bytes == 1024
    for bad in (123, ["a.yaml"]):  # was a raw TypeError from open()
        with pytest.raises(ConfigError, match=r"kv_connector_extra_config.config_file: .* must be the path of a YAML"):
            load_extra_config({"config_file": bad})


def test_packaged_vllm_examples_load_by_name(tmp_path, monkeypatch):
    from kvoffload.integrations.vllm import load_extra_config

    monkeypatch.chdir(tmp_path)  # not the checkout: the names resolve to the installed package
    tiers = load_extra_config({"config_file": "vllm_tiers"})
    assert [t.medium for t in tiers.tiers] == ["cpu", "disk"] and tiers.tiers[1].write_through
    spec = load_extra_config({"config_file": "vllm_spec", "config": {"store_threshold": 3}})
    assert spec.store_threshold == 3 and spec.tiers[0].eviction_policy == "arc"
