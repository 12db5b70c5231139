import time

import numpy as np
import pytest
import torch

from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.transfer.device_host_handler import DeviceHostHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE
from kvoffload.transfer.streams import CPUStreamPool
from kvoffload_ext import copy_block_groups, copy_blocks


def test_copy_blocks_rows_and_runs():
    src = torch.arange(10 * 16, dtype=torch.int64).to(torch.uint8).reshape(10, 16)
    dst = torch.zeros(12, 16, dtype=torch.uint8)
    copy_blocks(src, dst, [3, 4, 5, 9, 0], [0, 1, 2, 11, 7])  # a run of three, then singles
    for s, d in [(3, 0), (4, 1), (5, 2), (9, 11), (0, 7)]:
        assert torch.equal(dst[d], src[s])
    assert dst[3:7].sum() == 0 and dst[8:11].sum() == 0


def test_copy_blocks_strided_column_slices():
    src = torch.randint(0, 255, (6, 32), dtype=torch.uint8)
    dst = torch.zeros(6, 64, dtype=torch.uint8)
    copy_blocks(src[:, 8:24], dst[:, 40:56], [1, 2, 3], [5, 4, 3])
    assert torch.equal(dst[5, 40:56], src[1, 8:24]) and torch.equal(dst[3, 40:56], src[3, 8:24])
    assert dst[:, :40].sum() == 0


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 9, dtype=torch.uint8), [0], [0]), "row widths differ"),
        ((torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 8, dtype=torch.uint8), [4], [0]), "src block id 4 out of range"),
        ((torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 8, dtype=torch.uint8), [0, 1], [0]), "2 source ids but 1"),
        ((torch.zeros(4, 8), torch.zeros(4, 8), [0], [0]), "uint8"),
    ],
)
def test_copy_blocks_rejects_bad_input(args, match):
    with pytest.raises((ValueError, IndexError), match=match):
        copy_blocks(*args)


class SlowStreamPool(CPUStreamPool):
    """Each job sleeps first: slow copies, for tests of ordering and asynchrony."""

    def __init__(self, num_streams, delay_s):
        super().__init__(num_streams)
        self.delay_s = delay_s

    def submit(self, direction, fn, inline=False):
        def slow():
            time.sleep(self.delay_s)
            fn()

        return super().submit(direction, slow if self.delay_s else fn, inline and not self.delay_s)


def make_handler(num_device_blocks=12, host_blocks=6, factor=2, delay=0.0, chunk_bytes=1 << 20):
    layers = [torch.randn(2, num_device_blocks, 4, 2, 8) for _ in range(2)]
    kv = canonicalize(layers, num_device_blocks)
    host = HostBlockBuffer(host_blocks * factor, kv.page_bytes, chunk_bytes=chunk_bytes)
    return DeviceHostHandler(kv, host, factor, SlowStreamPool(2, delay)), kv


def page(kv, i):
    return b"".join(v[i].numpy().tobytes() for v in kv.views)


def drain(handler, n, timeout=10.0):
    out, t0 = [], time.time()
    while len(out) < n:
        out += handler.get_finished()
        assert time.time() - t0 < timeout
        time.sleep(0.001)
    return out


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 2048], ids=["one-chunk", "many-chunks"])
def test_store_then_load_round_trip_with_misaligned_first_block(chunk_bytes):
    handler, kv = make_handler(chunk_bytes=chunk_bytes)
    originals = {i: page(kv, i) for i in range(12)}
    # Store device blocks 1..4 as offloaded blocks (factor 2) into host slots 3 and 0.
    assert handler.transfer_async(1, (GPULoadStoreSpec([1, 2, 3, 4]), CPULoadStoreSpec([3, 0])))
    (r,) = drain(handler, 1)
    assert r.success and r.nbytes == 4 * kv.page_bytes and r.direction == DEVICE_TO_HOST
    for v in kv.views:
        v.zero_()
    # Load both offloaded blocks but skip the first engine block (already on the device).
    assert handler.transfer_async(2, (CPULoadStoreSpec([3, 0]), GPULoadStoreSpec([8, 9, 10])))
    (r,) = drain(handler, 1)
    assert r.success and r.direction == HOST_TO_DEVICE
    assert [page(kv, i) for i in (8, 9, 10)] == [originals[i] for i in (2, 3, 4)]
    assert page(kv, 7) == bytes(kv.page_bytes)
    handler.close()


def test_bad_skip_is_refused():
    handler, _ = make_handler()
    assert not handler.transfer_async(1, (CPULoadStoreSpec([0]), GPULoadStoreSpec([1, 2, 3])))
    handler.close()


def test_completions_in_submission_order_per_direction_and_wait_blocks():
    handler, _ = make_handler(delay=0.05)
    for job in range(6):
        if job % 2 == 0:
            handler.transfer_async(job, (GPULoadStoreSpec([job, job + 1]), CPULoadStoreSpec([job // 2])))
        else:
            handler.transfer_async(job, (CPULoadStoreSpec([0]), GPULoadStoreSpec([job, job + 1])))
    # Polling does not block: it returns what has landed, and jobs that take 0.05 s each in
    # order cannot all have (on a busy machine the first may have: CI saw one at 23 ms).
    early = handler.get_finished()
    assert len(early) < 6
    handler.wait([4])
    # wait returned only once job 4 (and, by ordering, jobs 0 and 2 before it) had finished.
    done = early + handler.get_finished()
    assert {0, 2, 4} <= {r.job_id for r in done}
    results = done + drain(handler, 6 - len(done))
    by_dir = {d: [r.job_id for r in results if r.direction == d] for d in (DEVICE_TO_HOST, HOST_TO_DEVICE)}
    assert by_dir == {DEVICE_TO_HOST: [0, 2, 4], HOST_TO_DEVICE: [1, 3, 5]}
    handler.close()


def test_failed_copy_is_a_failed_job_not_an_exception():
    handler, _ = make_handler()
    handler.host.num_rows = 2  # force an out-of-range host row inside the copy thread
    assert handler.transfer_async(1, (GPULoadStoreSpec([0, 1, 2, 3]), CPULoadStoreSpec([5, 4])))
    (r,) = drain(handler, 1)
    assert not r.success and r.nbytes == 0
    handler.close()


def test_copies_overlap_with_the_caller():
    """A long copy runs on a copy thread while the caller keeps going (GIL released)."""
    handler, _ = make_handler(delay=0.05)
    handler.transfer_async(1, (GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([0])))
    assert handler.get_finished() == []  # submitted and returned while the copy still runs
    drain(handler, 1)
    handler.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copy_blocks_matches_cpu():
    src = torch.randint(0, 255, (64, 4096), dtype=torch.uint8, device="cuda")
    host = torch.zeros(64, 4096, dtype=torch.uint8).pin_memory()
    ids = np.random.permutation(64)[:32]
    copy_blocks(src, host, ids, np.arange(32))
    torch.cuda.synchronize()
    assert torch.equal(host[:32], src[torch.from_numpy(ids).cuda()].cpu())
    back = torch.zeros_like(src)
    copy_blocks(host, back, np.arange(32), ids)
    torch.cuda.synchronize()
    assert torch.equal(back[torch.from_numpy(ids).cuda()], src[torch.from_numpy(ids).cuda()])


def test_copy_block_groups_one_call_for_views_of_several_widths_and_chunks():
    from kvoffload_ext import copy_block_groups

    widths = [8, 24, 4096, 100]
    srcs = [torch.randint(0, 255, (10, w), dtype=torch.uint8) for w in widths]
    host = torch.zeros(12, sum(widths), dtype=torch.uint8)
    offs = np.cumsum([0] + widths[:-1])
    s_ids, d_ids = np.array([9, 0, 1, 2, 5]), np.array([0, 1, 2, 3, 11])
    copy_block_groups([(s, host[:, o : o + w], s_ids, d_ids) for s, o, w in zip(srcs, offs, widths)])
    for s, o, w in zip(srcs, offs, widths):
        assert torch.equal(host[torch.from_numpy(d_ids), o : o + w], s[torch.from_numpy(s_ids)])
    untouched = np.setdiff1d(np.arange(12), d_ids)
    assert host[torch.from_numpy(untouched)].sum() == 0


def test_byte_ranges_fold_rows_that_continue_each_other():
    from kvoffload_ext.copies.ranges import byte_ranges

    src = torch.zeros(8, 16, dtype=torch.uint8)
    dst = torch.zeros(8, 16, dtype=torch.uint8)
    s, d, n = byte_ranges([(src, dst, np.array([2, 3, 4, 7, 0]), np.array([5, 6, 7, 0, 1]))])
    base_s, base_d = src.data_ptr(), dst.data_ptr()
    assert (s - base_s).tolist() == [32, 112, 0] and (d - base_d).tolist() == [80, 0, 16]
    assert n.tolist() == [48, 16, 16]  # rows 2..4 -> 5..7 in one range; 7 -> 0 and 0 -> 1 stay apart


def test_byte_ranges_of_many_groups_match_a_row_by_row_reference():
    """The all-groups-at-once computation against the obvious per-row one: groups of several
    widths and strides (views into wider rows), shared and empty id arrays, then folded."""
    from kvoffload_ext.copies.ranges import byte_ranges, fold

    rng = np.random.default_rng(7)
    base = [torch.zeros(40, 96, dtype=torch.uint8), torch.zeros(40, 96, dtype=torch.uint8)]
    shared = rng.permutation(40)[:12]
    groups = []
    for off, w in ((0, 8), (8, 24), (32, 64)):
        groups.append((base[0][:, off : off + w], base[1][:, off : off + w], shared, rng.permutation(40)[:12]))
    groups.append((base[0][:, :8], base[1][:, :8], np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)))
    groups.append((base[1], base[0], np.arange(5, 9), np.arange(6, 10)))  # whole rows: they fold
    rows = [(s.data_ptr() + int(i) * s.stride(0), d.data_ptr() + int(j) * d.stride(0), s.shape[1])
            for s, d, si, di in groups for i, j in zip(si, di)]
    want = fold(*(np.array(col, dtype=np.int64) for col in zip(*rows)))
    got = byte_ranges(groups)
    for a, b in zip(got, want):
        assert a.tolist() == b.tolist()
    assert len(got[0]) < len(rows)  # the last group's consecutive rows folded


def test_byte_ranges_by_block_put_each_blocks_rows_together():
    """Block by block: the i-th row of every group, then the next; groups of unequal length
    (several host chunks) keep group order. The same rows either way."""
    from kvoffload_ext.copies.ranges import byte_ranges

    k, v = torch.zeros(10, 32, dtype=torch.uint8), torch.zeros(10, 32, dtype=torch.uint8)
    host = torch.zeros(4, 64, dtype=torch.uint8)
    dev_ids, host_ids = np.array([7, 2, 5]), np.array([3, 0, 1])
    groups = [(k, host[:, :32], dev_ids, host_ids), (v, host[:, 32:], dev_ids, host_ids)]
    s, d, n = byte_ranges(groups, by_block=True)
    want_d = [host.data_ptr() + h * 64 + off for h in (3, 0, 1) for off in (0, 32)]
    want_s = [t.data_ptr() + i * 32 for i in (7, 2, 5) for t in (k, v)]
    assert d.tolist() == want_d and s.tolist() == want_s and n.tolist() == [32] * 6
    # Host rows 0 and 1 are consecutive and now filled in order: 0's V half, 1's K half continue
    # each other on the host side only, so nothing folds; group order gives the same set of rows.
    plain = byte_ranges(groups)
    assert sorted(zip(*(a.tolist() for a in plain))) == sorted(zip(s.tolist(), d.tolist(), n.tolist()))
    uneven = [groups[0], (v, host[:, 32:], dev_ids[:2], host_ids[:2])]
    assert [a.tolist() for a in byte_ranges(uneven, by_block=True)] == [a.tolist() for a in byte_ranges(uneven)]


def test_an_out_of_range_id_is_refused_in_every_group_sharing_its_array():
    src, dst = torch.zeros(8, 16, dtype=torch.uint8), torch.zeros(4, 16, dtype=torch.uint8)
    ids = np.array([0, 1, 2])
    copy_block_groups([(src, src, ids, ids)])  # the array checked (and memoized) against 8 rows
    with pytest.raises(IndexError, match=r"dst block id 2 out of range \[0, 2\)"):
        copy_block_groups([(src, src, ids, ids), (src, dst[:2], ids, ids)])  # same array, fewer rows


def test_bench_transfer_smoke(capsys):
    from kvoffload.cli import main

    main(["bench", "transfer", "--reps", "1", "--total-mib", "1", "--layers", "2", "--per-layer-kib", "64",
          "--cross-layer-kib", "64"])
    out = capsys.readouterr().out
    assert "device->host  per-layer" in out and "device->host  cross-layer" in out and "a/c" in out
    assert "1 MiB memcpys by (a)'s native loop" in out  # the baseline shares (a)'s threads and memcpy


def test_bench_transfer_refuses_cuda_without_a_gpu(capsys):
    from kvoffload.bench.transfer_bench import main

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit):
        main(["--device", "cuda"])
    assert "no CUDA device is visible" in capsys.readouterr().err


@pytest.mark.parametrize("direction", [DEVICE_TO_HOST, HOST_TO_DEVICE])
def test_a_jobs_rows_are_copied_in_source_order_with_every_pair_kept(direction):
    from kvoffload.transfer.host_tables import host_copy_groups
    from kvoffload_ext import copy_block_groups

    layers = [torch.randint(0, 255, (2, 16, 32), dtype=torch.uint8) for _ in range(2)]
    kv = canonicalize(layers, 16)
    host = HostBlockBuffer(12, kv.page_bytes, chunk_bytes=4 * kv.page_bytes)  # 3 chunks of 4 rows
    host.chunks[0].random_(0, 255), host.chunks[1].random_(0, 255), host.chunks[2].random_(0, 255)
    dev_ids, host_rows = np.array([9, 2, 14, 5, 0, 11]), np.array([7, 3, 0, 10, 4, 1])
    by_layer = host_copy_groups(kv, host, direction, dev_ids, host_rows)
    assert len(by_layer) == 2 and all(len(g) == 2 * 3 for g in by_layer)  # per layer: K and V views x 3 chunks
    groups = [g for layer in by_layer for g in layer]
    pairs = set()
    for src, dst, s_ids, d_ids in groups:
        assert np.all(np.diff(s_ids) > 0)  # ascending source rows
        if direction == DEVICE_TO_HOST:
            chunk = next(c for c, t in enumerate(host.chunks) if t.data_ptr() <= dst.data_ptr() < t.data_ptr() + t.nbytes)
            pairs |= {(int(s), int(d) + 4 * chunk) for s, d in zip(s_ids, d_ids)}
        else:
            chunk = next(c for c, t in enumerate(host.chunks) if t.data_ptr() <= src.data_ptr() < t.data_ptr() + t.nbytes)
            pairs |= {(int(d), int(s) + 4 * chunk) for s, d in zip(s_ids, d_ids)}
    assert pairs == set(zip(dev_ids.tolist(), host_rows.tolist()))
    before = [t.clone() for t in layers]
    copy_block_groups(groups)
    for d, h in zip(dev_ids.tolist(), host_rows.tolist()):  # byte-identical, whatever the order
        assert torch.equal(torch.cat([layer[:, d].reshape(-1) for layer in layers]), host.row(h))
    if direction == DEVICE_TO_HOST:
        assert all(torch.equal(a, b) for a, b in zip(layers, before))  # the source is untouched
