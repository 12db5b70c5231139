"""Small copies run in the caller (a copy thread's hand-off cost the tiny model's demo 10%), and
only where that keeps every promise of the copy threads: order per direction, failures as failed
jobs, no wait behind a demotion still reading the slots."""

import threading

import numpy as np
import torch

from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.transfer.device_host_handler import INLINE_BYTES, DeviceHostHandler
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE
from kvoffload.transfer.slot_fence import SlotFences
from kvoffload.transfer.streams import CPUStreamPool, JobHandle


def test_an_inline_job_runs_in_the_caller_and_is_done_on_return():
    pool = CPUStreamPool(2)
    ran_on: list[int] = []
    handle = pool.submit(DEVICE_TO_HOST, lambda: ran_on.append(threading.get_ident()), inline=True)
    assert ran_on == [threading.get_ident()] and handle.done() and handle.error() is None
    other = pool.submit(DEVICE_TO_HOST, lambda: ran_on.append(threading.get_ident()))
    other.wait()
    assert ran_on[1] != threading.get_ident()  # without inline: a copy thread
    pool.close()


def test_an_inline_job_behind_a_running_one_waits_its_turn_on_a_thread():
    pool = CPUStreamPool(2)
    gate, order = threading.Event(), []
    first = pool.submit(HOST_TO_DEVICE, lambda: (gate.wait(5), order.append("first")))
    second = pool.submit(HOST_TO_DEVICE, lambda: order.append("second"), inline=True)
    assert not second.done() and order == []  # not run ahead of the job before it
    gate.set()
    second.wait()
    assert first.done() and order == ["first", "second"]
    third = pool.submit(DEVICE_TO_HOST, lambda: order.append("third"), inline=True)  # another direction: free
    assert third.done() and order[-1] == "third"
    pool.close()


def test_a_failing_inline_job_is_a_failed_job_not_an_exception_in_the_caller():
    pool = CPUStreamPool(1)

    def boom() -> None:
        raise OSError("copy failed")

    handle = pool.submit(DEVICE_TO_HOST, boom, inline=True)
    assert handle.done() and isinstance(handle.error(), OSError) and handle.seconds() == 0.0
    later = pool.submit(DEVICE_TO_HOST, lambda: None, inline=True)  # the lane goes on
    assert later.done() and later.error() is None
    pool.close()


class SpyPool(CPUStreamPool):
    def __init__(self) -> None:
        super().__init__(1)
        self.inline: list[bool] = []

    def submit(self, direction, fn, inline=False):
        self.inline.append(inline)
        return super().submit(direction, fn, inline)


class Pending(JobHandle):
    """A demotion that is still reading its slots until ``finish``."""

    def __init__(self) -> None:
        self.finished = threading.Event()

    def done(self) -> bool:
        return self.finished.is_set()

    def wait(self) -> None:
        assert threading.current_thread() is not threading.main_thread(), "the caller waited for a fence"
        self.finished.wait(5)

    def error(self):
        return None

    def seconds(self) -> float:
        return 0.0


def _handler(page_elems: int, fences: SlotFences | None = None):
    layers = [torch.randn(2, 8, page_elems) for _ in range(2)]
    kv = canonicalize(layers, 8)
    host = HostBlockBuffer(8, kv.page_bytes)
    pool = SpyPool()
    return DeviceHostHandler(kv, host, 1, pool, fences), kv, pool


def _round_trip(handler, kv, n):
    ids = np.arange(n)
    src = [v.clone() for v in kv.views]
    assert handler.transfer_async(1, (GPULoadStoreSpec(ids), CPULoadStoreSpec(ids)))
    handler.wait([1])
    for v in kv.views:
        v.zero_()
    assert handler.transfer_async(2, (CPULoadStoreSpec(ids), GPULoadStoreSpec(ids)))
    handler.wait([2])
    assert [r.success for r in handler.get_finished()] == [True, True]
    for v, s in zip(kv.views, src):
        assert torch.equal(v[:n], s[:n])  # byte-identical after the round trip, inline or not
    handler.close()


def test_a_job_up_to_inline_bytes_runs_in_the_caller():
    handler, kv, pool = _handler(256)
    assert 4 * kv.page_bytes <= INLINE_BYTES
    _round_trip(handler, kv, 4)
    assert pool.inline == [True, True]


def test_a_job_past_inline_bytes_goes_to_a_copy_thread():
    handler, kv, pool = _handler(INLINE_BYTES // 4)  # one block's page is past the bound
    assert kv.page_bytes > INLINE_BYTES
    _round_trip(handler, kv, 2)
    assert pool.inline == [False, False]


def test_a_store_into_slots_a_demotion_still_reads_is_not_run_inline():
    fences = SlotFences()
    handler, kv, pool = _handler(64, fences)
    demotion = Pending()
    fences.mark([3], demotion)
    handler.submit_rows(7, DEVICE_TO_HOST, np.array([0]), np.array([3]), fenced_slots=[3])
    handler.submit_rows(8, DEVICE_TO_HOST, np.array([1]), np.array([4]), fenced_slots=[4])
    assert pool.inline == [False, True]
    assert handler.get_finished() == []  # the small one queued behind the one waiting for the demotion
    demotion.finished.set()
    handler.wait([7, 8])
    handler.submit_rows(9, DEVICE_TO_HOST, np.array([2]), np.array([3]), fenced_slots=[3])
    assert pool.inline[-1] is True  # the demotion is over: nothing to wait for
    assert all(r.success for r in handler.get_finished())
    handler.close()
