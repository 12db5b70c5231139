"""Store backpressure: a slow tier's stores are skipped (reported as such, not as errors) instead
of queueing without limit, a recovered tier is used again, and its loads never wait behind its
stores."""

import threading
import time

import pytest
import torch

from kvoffload.offload.mediums import DISK, CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvoffload.testing.memory_tier import MemoryIO
from kvoffload.transfer.backpressure import StoreBackpressure
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.secondary_handler import SecondaryTierHandler
from kvoffload.transfer.slot_fence import SlotFences


def test_why_late_names_the_overrun_store_before_any_store_finished():
    """The log line said "0.0x the time allowed" when the first store was still overrunning."""
    bp = StoreBackpressure(s_per_mib=0.001, per_job_s=0.001)  # 1 KiB: about 1 ms allowed
    token = bp.started(1024)
    time.sleep(0.02)
    assert not bp.admit() and bp.lateness == 0.0
    why = bp.why_late()
    assert why.startswith("a store still running has taken ") and why.endswith("x the time allowed")
    assert float(why.split("taken ")[1].split("x")[0]) >= 10.0
    bp.finished(token)
    assert bp.lateness > 1.0 and bp.why_late() == f"stores take {bp.lateness:.1f}x the time allowed on average"


def test_stores_are_admitted_while_on_time_skipped_while_late_and_again_after_recovery():
    bp = StoreBackpressure(s_per_mib=0.001, per_job_s=0.01)  # 1 MiB: 11 ms allowed
    assert bp.admit()  # nothing in flight: always
    a = bp.started(1 << 20)
    assert bp.admit()  # in flight but on time
    time.sleep(0.02)
    assert not bp.admit() and bp.num_skipped == 1  # the running store overran its allowance
    bp.finished(a)
    assert bp.lateness > 1.0
    assert bp.admit()  # nothing in flight: a probe goes through, late average or not
    b = bp.started(1 << 20)
    assert not bp.admit()  # late on average
    bp.finished(b)  # the probe was fast: the average falls back below 1
    for _ in range(10):
        bp.finished(bp.started(1 << 20))
    c = bp.started(1 << 20)
    assert bp.admit() and bp.lateness < 1.0
    bp.finished(c)
    assert StoreBackpressure(None).admit()
    with pytest.raises(ValueError, match="s_per_mib=0"):
        StoreBackpressure(0)


class SlowWrites(MemoryIO):
    def __init__(self, delay_s):
        super().__init__()
        self.delay_s = delay_s
        self.writing = threading.Event()

    def write(self, blocks, slots, keys):
        self.writing.set()
        time.sleep(self.delay_s)
        super().write(blocks, slots, keys)


def _drain(handler, n):
    out, t0 = [], time.time()
    while len(out) < n:
        out += handler.get_finished()
        assert time.time() - t0 < 10, "copies did not finish"
        time.sleep(0.002)
    return out


def _handler(io, bound):
    kv = canonicalize([torch.randn(2, 8, 4, 2, 8) for _ in range(2)], 8)
    host = HostBlockBuffer(8, kv.page_bytes)
    return kv, SecondaryTierHandler(DISK, io, kv, host, 1, kv.page_bytes, SlotFences(), SlotFences(),
                                    store_latency_bound_s=bound)


def test_a_slow_tier_skips_stores_instead_of_queueing_them_and_loads_overtake_its_stores():
    io = SlowWrites(0.3)
    kv, handler = _handler(io, bound=0.001)
    io.records[5] = ("loaded", b"\x05" * kv.page_bytes)
    assert handler.transfer_async(1, (CPULoadStoreSpec([0]), DiskLoadStoreSpec([0], ["a"])))
    assert io.writing.wait(5)
    time.sleep(0.05)
    for job in range(2, 6):  # the first store overran its 11 ms: these are skipped at once
        assert handler.transfer_async(job, (CPULoadStoreSpec([job]), DiskLoadStoreSpec([job], [f"k{job}"])))
    assert handler.transfer_async(9, (DiskLoadStoreSpec([5], ["loaded"]), GPULoadStoreSpec([3])))
    (load,) = [r for r in _drain(handler, 1) if r.job_id == 9] or [None]
    assert load is not None and load.success, "the load waited behind the slow store"
    results = {r.job_id: r for r in _drain(handler, 5)}
    assert results[1].success and not results[1].skipped
    assert all(results[j].skipped and not results[j].success and not results[j].io_error for j in range(2, 6))
    assert set(io.records) == {0, 5} and handler.backpressure.num_skipped == 4
    io.delay_s = 0.0  # the tier recovers: nothing in flight, so the next store probes it
    assert handler.transfer_async(10, (CPULoadStoreSpec([6]), DiskLoadStoreSpec([6], ["b"])))
    (r,) = _drain(handler, 1)
    assert r.success and 6 in io.records
    handler.close()


def test_without_a_bound_every_store_is_queued():
    io = SlowWrites(0.05)
    _, handler = _handler(io, bound=None)
    for job in range(4):
        assert handler.transfer_async(job, (CPULoadStoreSpec([job]), DiskLoadStoreSpec([job], [f"k{job}"])))
    results = _drain(handler, 4)
    assert all(r.success for r in results) and len(io.records) == 4
    handler.close()


def test_a_load_never_waits_for_queued_stores_of_its_tier():
    """Stores queue behind each other (one direction, in order); a load is another direction
    with a thread of its own, so it runs at once however many stores are queued."""
    io = SlowWrites(0.3)
    kv, handler = _handler(io, bound=None)
    io.records[7] = ("loaded", b"\x05" * kv.page_bytes)
    for job in range(3):
        assert handler.transfer_async(job, (CPULoadStoreSpec([job]), DiskLoadStoreSpec([job], [f"k{job}"])))
    assert io.writing.wait(5)
    t0 = time.monotonic()
    assert handler.transfer_async(9, (DiskLoadStoreSpec([7], ["loaded"]), GPULoadStoreSpec([3])))
    (first,) = _drain(handler, 1)
    assert first.job_id == 9 and first.success and time.monotonic() - t0 < 0.25
    assert b"".join(v[3].numpy().tobytes() for v in kv.views) == b"\x05" * kv.page_bytes
    assert sorted(r.job_id for r in _drain(handler, 3)) == [0, 1, 2]
    handler.close()


def test_skipped_stores_are_not_counted_as_failed_copies():
    from kvoffload.connector.worker.transfer_stats import TransferStats
    from kvoffload.transfer.result import TransferResult

    stats = TransferStats()
    stats.record(TransferResult(1, False, 0, 0.0, "host_to_fs", skipped=True))
    stats.record(TransferResult(2, False, 0, 0.1, "host_to_fs", io_error=True))
    stats.record(TransferResult(3, True, 4096, 0.1, "host_to_fs"))
    d = stats.by_direction["host_to_fs"]
    assert (d.jobs, d.failed, d.nbytes) == (3, 1, 4096)
