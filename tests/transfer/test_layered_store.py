"""Layer-wise stores on the real device/host handler: a layer is copied once the forward pass
has written it, the job is published only at its step's end with every layer landed, and an
aborted one publishes nothing."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.transfer.device_host_handler import DeviceHostHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.result import DEVICE_TO_HOST
from kvoffload.transfer.streams import CPUStreamPool
from tests.transfer.test_copy_and_transfer import drain, page

NAMES = ("model.layers.0.attn", "model.layers.1.attn", "model.layers.2.attn")


def make_handler(num_device_blocks=12, host_blocks=6, factor=2):
    torch.manual_seed(0)
    layers = {name: torch.randn(2, num_device_blocks, 4, 2, 8) for name in NAMES}
    kv = canonicalize(layers, num_device_blocks)
    host = HostBlockBuffer(host_blocks * factor, kv.page_bytes, chunk_bytes=2048)
    return DeviceHostHandler(kv, host, factor, CPUStreamPool(2)), kv, layers


def host_layer(handler, kv, layer, host_block):
    """The bytes of one KV tensor (layer) of an offloaded block's host rows."""
    out = []
    for view, offset, tensor in zip(kv.views, kv.row_offsets, kv.view_tensors):
        if tensor != layer:
            continue
        for row in range(host_block * handler.factor, (host_block + 1) * handler.factor):
            chunk, local = divmod(row, handler.host.rows_per_chunk)
            out.append(handler.host.columns(chunk, offset, view.shape[1])[local].numpy().tobytes())
    return b"".join(out)


def device_layer(kv, layer, device_blocks):
    return b"".join(view[b].numpy().tobytes() for view, tensor in zip(kv.views, kv.view_tensors) if tensor == layer
                    for b in device_blocks)


def test_each_layer_is_copied_when_written_and_the_job_ends_with_its_step():
    handler, kv, layers = make_handler()
    spec = (GPULoadStoreSpec([1, 2, 3, 4]), CPULoadStoreSpec([3, 0]))
    assert handler.open_layered_store(7, spec)
    layer0 = device_layer(kv, 0, [1, 2])
    handler.layer_written(0)
    handler.wait([])  # nothing to wait for by id: the job is not over before its step
    with pytest.raises(RuntimeError, match="before its step ended"):
        handler.wait([7])
    # Layer 0 is out (once its copy ran); the forward pass then writes layer 0 again (a test
    # stand-in for a later change) and layers 1 and 2 for the first time.
    assert wait_until(lambda: host_layer(handler, kv, 0, 3) == layer0)
    assert handler.get_finished() == []  # every layer written, but the step has not ended
    layers[NAMES[0]][:, 1].add_(1.0)
    layers[NAMES[1]][:, 1].add_(1.0)
    handler.layer_written(1)
    handler.end_layered_stores(commit=True)  # layer 2 was never named: copied now
    (r,) = drain(handler, 1)
    assert r.job_id == 7 and r.success and r.direction == DEVICE_TO_HOST and r.nbytes == 4 * kv.page_bytes
    assert host_layer(handler, kv, 0, 3) == layer0  # copied when written, not at the end
    for layer in (1, 2):
        assert host_layer(handler, kv, layer, 3) == device_layer(kv, layer, [1, 2])
        assert host_layer(handler, kv, layer, 0) == device_layer(kv, layer, [3, 4])
    handler.close()


def wait_until(check, timeout=10.0) -> bool:
    t0 = time.time()
    while not check():
        if time.time() - t0 > timeout:
            return False
        time.sleep(0.001)
    return True


def test_a_round_trip_through_a_layered_store_is_byte_identical():
    handler, kv, _ = make_handler()
    originals = {i: page(kv, i) for i in range(12)}
    assert handler.open_layered_store(1, (GPULoadStoreSpec([5, 6, 7, 8]), CPULoadStoreSpec([2, 4])))
    for layer in range(3):
        handler.layer_written(layer)
    handler.end_layered_stores(commit=True)
    handler.wait([1])
    for v in kv.views:
        v.zero_()
    assert handler.transfer_async(2, (CPULoadStoreSpec([2, 4]), GPULoadStoreSpec([0, 1, 2, 3])))
    results = drain(handler, 2)
    assert all(r.success for r in results)
    assert [page(kv, i) for i in range(4)] == [originals[i] for i in (5, 6, 7, 8)]
    handler.close()


def test_an_aborted_store_fails_without_a_warning_and_later_stores_are_unaffected(caplog):
    handler, kv, _ = make_handler()
    assert handler.open_layered_store(1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([0])))
    handler.layer_written(0)  # one layer copied out before the step failed
    with caplog.at_level(logging.WARNING):
        handler.end_layered_stores(commit=False)
        handler.layer_written(1)  # a late hook after the verdict copies nothing
        (r,) = drain(handler, 1)
    assert not r.success and r.nbytes == 0 and not r.io_error
    assert "copy failed" not in caplog.text
    # The next step's store of the same slot is whole and correct.
    assert handler.open_layered_store(2, (GPULoadStoreSpec([3, 4]), CPULoadStoreSpec([0])))
    handler.end_layered_stores(commit=True)
    (r,) = drain(handler, 1)
    assert r.success
    for layer in range(3):
        assert host_layer(handler, kv, layer, 0) == device_layer(kv, layer, [3, 4])
    handler.close()


def test_loads_and_unnamed_caches_are_not_taken_layer_by_layer():
    handler, _, _ = make_handler()
    assert not handler.open_layered_store(1, (CPULoadStoreSpec([0]), GPULoadStoreSpec([1, 2])))
    assert not handler.open_layered_store(2, (GPULoadStoreSpec([1, 2, 3]), CPULoadStoreSpec([0])))  # 3 pages, 2 rows
    handler.close()
    layers = [torch.randn(2, 12, 4, 2, 8) for _ in range(2)]  # no layer names: nothing to follow
    kv = canonicalize(layers, 12)
    plain = DeviceHostHandler(kv, HostBlockBuffer(12, kv.page_bytes), 2, CPUStreamPool(2))
    assert not plain.open_layered_store(1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([0])))
    plain.close()


def test_a_cache_whose_tensors_several_layers_share_stores_whole():
    """vLLM's hybrid allocator: one tensor per layer slot, shared by a layer of each group."""
    shared = torch.randn(2, 12, 4, 2, 8)
    kv = canonicalize({"model.layers.0.attn": shared, "model.layers.1.attn": shared}, 12)
    assert len(set(kv.layer_tensors.values())) == 1
    handler = DeviceHostHandler(kv, HostBlockBuffer(12, kv.page_bytes), 2, CPUStreamPool(2))
    assert not handler.open_layered_store(1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([0])))
    handler.close()
