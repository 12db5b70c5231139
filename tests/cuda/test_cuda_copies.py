"""The CUDA copy path on a real GPU: kernel and loop against a reference, pinned chunks, stream
ordering, and that copies never hold up the compute stream. Skips cleanly without CUDA."""

import time

import numpy as np
import pytest
import torch

from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.transfer.device_host_handler import DeviceHostHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE
from kvoffload.transfer.streams import CUDAStreamPool
from kvoffload_ext import copy_block_groups, copy_blocks

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROWS = [2048, 2049, 4104, 32 << 10, (1 << 20) + 7, 2 << 20]  # 2 KiB .. 2 MiB, some not a multiple of 16
OFFSETS = [(0, 0), (5, 21), (3, 17)]  # aligned; same misalignment both sides; different misalignment


def loop_impl(src, dst, s_ids, d_ids):
    from kvoffload_ext.copies.cuda_copy import copy_blocks_loop

    copy_blocks_loop(src, dst, np.asarray(s_ids), np.asarray(d_ids))


def kernel_impl(src, dst, s_ids, d_ids):
    from kvoffload_ext.copies.cuda_copy import SLICE_BYTES, copy_table_cuda
    from kvoffload_ext.copies.group_table import group_table

    device = src.device if src.is_cuda else dst.device
    copy_table_cuda(group_table([(src, dst, np.asarray(s_ids), np.asarray(d_ids))], SLICE_BYTES), device)


def batch_impl(src, dst, s_ids, d_ids):
    from kvoffload_ext.copies.batch_memcpy import copy_ranges_batch
    from kvoffload_ext.copies.ranges import byte_ranges

    device = src.device if src.is_cuda else dst.device
    ranges = byte_ranges([(src, dst, np.asarray(s_ids), np.asarray(d_ids))])
    side = torch.cuda.Stream(device)  # the batch call refuses the legacy default stream
    side.wait_stream(torch.cuda.current_stream(device))
    copy_ranges_batch(*ranges, side.cuda_stream)
    torch.cuda.current_stream(device).wait_stream(side)


@pytest.fixture(params=["methods", "kernel", "batch", "loop"])
def impl(request):
    """Each copy method alone, and ``copy_blocks`` as the device's chosen methods route it."""
    if request.param == "kernel":
        pytest.importorskip("cupy")
        return kernel_impl
    if request.param == "batch":
        from kvoffload_ext.copies.batch_memcpy import unavailable_reason

        if unavailable_reason() is not None:
            pytest.skip(f"cuMemcpyBatchAsync: {unavailable_reason()}")
        return batch_impl
    return copy_blocks if request.param == "methods" else loop_impl


@pytest.mark.parametrize("offsets", OFFSETS, ids=["aligned", "same-misalignment", "mixed-misalignment"])
@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_copy_matches_reference(impl, direction, row, offsets):
    rng = np.random.default_rng(row + offsets[0])
    n_dev, n_host = (40, 24) if row <= 32 << 10 else (10, 6)
    dev = torch.randint(0, 256, (n_dev, row + 40), dtype=torch.uint8, device="cuda")
    host = torch.randint(0, 256, (n_host, row + 40), dtype=torch.uint8).pin_memory()
    dev_ids = rng.permutation(n_dev)[:n_host]
    host_ids = rng.permutation(n_host)
    d_off, h_off = offsets
    dev_cols, host_cols = dev[:, d_off : d_off + row], host[:, h_off : h_off + row]
    if direction == "d2h":
        expected = host.clone()
        expected[torch.from_numpy(host_ids), h_off : h_off + row] = dev_cols.cpu()[torch.from_numpy(dev_ids)]
        impl(dev_cols, host_cols, dev_ids, host_ids)
        torch.cuda.synchronize()
        assert torch.equal(host, expected)  # every copied byte right, nothing else touched
    else:
        expected = dev.cpu()
        expected[torch.from_numpy(dev_ids), d_off : d_off + row] = host_cols[torch.from_numpy(host_ids)]
        impl(host_cols, dev_cols, host_ids, dev_ids)
        torch.cuda.synchronize()
        assert torch.equal(dev.cpu(), expected)


def test_one_launch_copies_groups_of_different_widths():
    pytest.importorskip("cupy")
    widths = [16, 1000, 4096, 65 << 10]
    devs = [torch.randint(0, 256, (12, w), dtype=torch.uint8, device="cuda") for w in widths]
    host = torch.zeros(6, sum(widths), dtype=torch.uint8).pin_memory()
    offs = np.cumsum([0] + widths[:-1])
    dev_ids, host_ids = np.array([11, 0, 5, 6, 7, 2]), np.array([3, 4, 5, 0, 1, 2])
    copy_block_groups([(d, host[:, o : o + w], dev_ids, host_ids) for d, o, w in zip(devs, offs, widths)])
    torch.cuda.synchronize()
    for d, o, w in zip(devs, offs, widths):
        assert torch.equal(host[torch.from_numpy(host_ids), o : o + w], d.cpu()[torch.from_numpy(dev_ids)])


def test_host_chunks_are_pinned_and_unpinned_host_is_refused():
    host = HostBlockBuffer(10, 4096, pin=True, chunk_bytes=3 * 4096)
    assert len(host.chunks) == 4 and all(c.is_pinned() for c in host.chunks)
    dev = torch.zeros(4, 4096, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="pinned"):
        copy_blocks(dev, torch.zeros(4, 4096, dtype=torch.uint8), [0], [0])


def cuda_handler(num_streams=4, blocks=16, factor=1, chunk_bytes=1 << 20):
    layers = [torch.randn(2, blocks, 16, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3)]
    kv = canonicalize(layers, blocks)
    host = HostBlockBuffer(blocks * factor, kv.page_bytes, pin=True, chunk_bytes=chunk_bytes)
    return DeviceHostHandler(kv, host, factor, CUDAStreamPool(torch.device("cuda"), num_streams)), kv


def page(kv, i):
    return b"".join(v[i].cpu().numpy().tobytes() for v in kv.views)


def drain(handler, n, timeout=30.0):
    out, t0 = [], time.time()
    while len(out) < n:
        out += handler.get_finished()
        assert time.time() - t0 < timeout
    return out


def test_store_waits_for_the_compute_stream():
    """A store submitted right after the compute stream writes a block copies the written bytes."""
    handler, kv = cuda_handler()
    torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time queued on the compute stream first
    for v in kv.views:
        v[3].fill_(7)
    assert handler.transfer_async(1, (GPULoadStoreSpec([3]), CPULoadStoreSpec([5])))
    (r,) = drain(handler, 1)
    assert r.success and r.direction == DEVICE_TO_HOST
    assert bytes(handler.host.row(5).numpy()) == bytes([7]) * kv.page_bytes
    handler.close()


def test_load_after_store_of_the_same_slot_sees_the_stored_bytes():
    handler, kv = cuda_handler(chunk_bytes=3 * 8192)
    stored = {i: page(kv, i) for i in range(16)}
    for job, (dev, slot) in enumerate([(1, 4), (2, 4), (9, 0)]):  # slot 4 written twice: the later store wins
        assert handler.transfer_async(job, (GPULoadStoreSpec([dev]), CPULoadStoreSpec([slot])))
    assert [r.job_id for r in drain(handler, 3)] == [0, 1, 2]
    assert handler.transfer_async(3, (CPULoadStoreSpec([4, 0]), GPULoadStoreSpec([12, 13])))
    (r,) = drain(handler, 1)
    assert r.success and r.direction == HOST_TO_DEVICE
    assert page(kv, 12) == stored[2] and page(kv, 13) == stored[9]
    handler.close()


def test_copies_never_block_the_compute_stream():
    """A long copy in flight on the pool (both directions, the kernel path: 32 KiB rows); a
    kernel queued on the compute stream afterwards finishes long before the copy does: no
    dependency on the copy streams, and free SMs beside the copy kernel's small grid."""
    blocks = 256
    layers = [torch.zeros(2, blocks, 32 << 10, dtype=torch.uint8, device="cuda") for _ in range(32)]  # 512 MiB
    kv = canonicalize(layers, blocks)
    host = HostBlockBuffer(blocks, kv.page_bytes, pin=True)
    pool = CUDAStreamPool(torch.device("cuda"), 2)
    handler = DeviceHostHandler(kv, host, 1, pool)
    compute = torch.cuda.current_stream()
    x = torch.randn(1024, 1024, device="cuda")
    x @ x
    torch.cuda.synchronize()
    ids = list(range(blocks))
    for direction, spec in ((DEVICE_TO_HOST, (GPULoadStoreSpec(ids), CPULoadStoreSpec(ids))),
                            (HOST_TO_DEVICE, (CPULoadStoreSpec(ids), GPULoadStoreSpec(ids)))):
        assert handler.transfer_async(1, spec)
        copy_end = pool._last[direction]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(compute)
        y = x @ x
        end.record(compute)
        end.synchronize()
        assert not copy_end.query(), f"{direction}: the compute kernel waited for the copy to end"
        assert start.elapsed_time(end) < 5.0, f"{direction}: a 1024^3 matmul took {start.elapsed_time(end):.1f} ms"
        (r,) = drain(handler, 1)
        assert r.success and r.direction == direction and y.shape == (1024, 1024)
    handler.close()


LAYOUTS = {
    "kv-first": lambda nb: [torch.randn(2, nb, 16, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4)],
    "blocks-first": lambda nb: [torch.randn(nb, 2, 16, 8, 64, device="cuda", dtype=torch.float16) for _ in range(4)],
    "cross-layer": lambda nb: torch.randn(nb, 4, 2, 16, 8, 64, device="cuda", dtype=torch.float16),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_of_real_cuda_kv_round_trip(layout):
    nb = 20
    tensors = LAYOUTS[layout](nb)
    kv = canonicalize(tensors, nb)
    assert kv.device.type == "cuda" and kv.page_bytes == 4 * 2 * 16 * 8 * 64 * 2
    host = HostBlockBuffer(8, kv.page_bytes, pin=True, chunk_bytes=3 * kv.page_bytes)
    handler = DeviceHostHandler(kv, host, 2, CUDAStreamPool(torch.device("cuda"), 2))
    originals = {i: page(kv, i) for i in range(nb)}
    # The canonical page is the block's bytes taken from the engine tensors themselves.
    whole = [tensors] if isinstance(tensors, torch.Tensor) else tensors
    if layout == "cross-layer":
        assert originals[5] == tensors[5].cpu().view(torch.uint8).numpy().tobytes()
    elif layout == "blocks-first":
        assert originals[5] == b"".join(t[5].cpu().view(torch.uint8).numpy().tobytes() for t in whole)
    else:
        assert originals[5] == b"".join(t[kv_i, 5].cpu().view(torch.uint8).numpy().tobytes() for t in whole for kv_i in (0, 1))
    assert handler.transfer_async(1, (GPULoadStoreSpec([5, 6, 17, 18]), CPULoadStoreSpec([3, 0])))
    drain(handler, 1)
    for t in whole:
        t.zero_()
    assert handler.transfer_async(2, (CPULoadStoreSpec([3, 0]), GPULoadStoreSpec([1, 2, 3])))  # skips block 5's row
    (r,) = drain(handler, 1)
    assert r.success
    assert [page(kv, i) for i in (1, 2, 3)] == [originals[i] for i in (6, 17, 18)]
    handler.close()


def test_issuing_copies_never_waits_for_an_earlier_held_up_copy():
    """A copy queued behind ~200 ms of GPU work (a store waiting for the compute stream) still
    holds its kernel table's pinned staging buffer; later copies on a free stream must be
    issued at once (another buffer), never wait for it on the host."""
    pytest.importorskip("cupy")
    src = torch.randint(0, 256, (64, 8192), dtype=torch.uint8, device="cuda")
    dst = torch.zeros(64, 8192, dtype=torch.uint8).pin_memory()
    copy_blocks(src, dst, [0], [0])  # compile the kernel outside the timed part
    torch.cuda.synchronize()
    held, free = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(held):
        torch.cuda._sleep(400_000_000)
        copy_blocks(src, dst, list(range(32)), list(range(32)))
    t0 = time.perf_counter()
    with torch.cuda.stream(free):
        for _ in range(20):
            copy_blocks(src, dst, list(range(32, 64)), list(range(32, 64)))
    issued = time.perf_counter() - t0
    torch.cuda.synchronize()
    assert issued < 0.1, f"issuing 20 copies took {issued * 1e3:.0f} ms: the host waited for the held-up one"
    assert torch.equal(dst, src.cpu())


def test_the_copy_methods_are_measured_each_width_once_and_logs_the_layout(caplog):
    from kvoffload_ext.copies.copy_methods import D2H, H2D, CopyMethods
    from kvoffload_ext.copies.cuda_copy import _probe, methods_for

    device = torch.device("cuda", torch.cuda.current_device())
    methods = methods_for(device).methods
    calls = []

    def probe(method, row, direction):
        calls.append((method, row, direction))
        return _probe(device, method, row, direction)

    chosen = CopyMethods("test", probe, methods)
    with caplog.at_level("INFO", logger="kvoffload"):
        rows = chosen.prepare([8192, 65536, 1 << 20])
        chosen.prepare([1 << 20, 8192])
    assert len(calls) == 3 * 2 * len(methods)
    assert [(r.row_bytes, r.direction) for r in rows] == [(w, d) for w in (8192, 65536, 1 << 20) for d in (D2H, H2D)]
    assert all(r.method in r.gbps and r.gbps[r.method] == max(r.gbps.values()) for r in rows)
    assert len([r for r in caplog.records if "copy methods for test" in r.getMessage()]) == 1
    for r in rows:
        print(r.describe())


def test_kernel_launches_raise_no_cupy_deprecation_warning():
    pytest.importorskip("cupy")
    import warnings

    dev = torch.randint(0, 256, (16, 8192), dtype=torch.uint8, device="cuda")
    host = torch.empty((16, 8192), dtype=torch.uint8).pin_memory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.stream(torch.cuda.Stream()):  # a stream CuPy has not wrapped yet
            kernel_impl(dev, host, np.arange(16), np.arange(16))
        torch.cuda.synchronize()
    assert torch.equal(host, dev.cpu())
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and "Stream" in str(w.message)] == []
