"""The secondary-tier handler's fences: a victim staged out of a tier's slot is read before a
later copy writes that slot, however slow the read; and a host slot is read before reuse."""

import threading
import time

import torch

from kvoffload.offload.mediums import DISK, CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvoffload.testing.memory_tier import REMOTE, MemoryIO, RemoteLoadStoreSpec
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.secondary_handler import SecondaryTierHandler
from kvoffload.transfer.slot_fence import SlotFences


class SlowReads(MemoryIO):
    def __init__(self, delay_s):
        super().__init__()
        self.delay_s = delay_s
        self.read_started = threading.Event()

    def read(self, slots, keys, out):
        self.read_started.set()
        time.sleep(self.delay_s)
        super().read(slots, keys, out)


def _drain(handlers, n):
    out, t0 = [], time.time()
    while len(out) < n:
        for h in handlers:
            out += h.get_finished()
        assert time.time() - t0 < 10, "copies did not finish"
        time.sleep(0.005)
    return out


def test_a_staged_victim_is_read_before_the_write_that_reuses_its_slot():
    num_blocks = 4
    kv = canonicalize([torch.randn(2, num_blocks, 4, 2, 8) for _ in range(2)], num_blocks)
    host = HostBlockBuffer(2, kv.page_bytes)
    host.rows(0, 1).copy_(torch.full((1, kv.page_bytes), 7, dtype=torch.uint8))  # the new block's bytes
    host_fences, disk_fences, remote_fences = SlotFences(), SlotFences(), SlotFences()
    disk_io, remote_io = SlowReads(0.3), MemoryIO()
    disk_io.records[0] = ("old", b"\x01" * kv.page_bytes)  # the victim, in disk slot 0
    disk = SecondaryTierHandler(DISK, disk_io, kv, host, 1, kv.page_bytes, host_fences, disk_fences)
    remote = SecondaryTierHandler(REMOTE, remote_io, kv, host, 1, kv.page_bytes, host_fences, remote_fences,
                                  upstream={DISK: (disk_io, disk_fences)})
    # The order the connector submits a step's demotions: the victim out first, then the write.
    assert remote.transfer_async(1, (DiskLoadStoreSpec([0], ["old"]), RemoteLoadStoreSpec([0], ["old"])))
    assert disk.transfer_async(2, (CPULoadStoreSpec([0]), DiskLoadStoreSpec([0], ["new"])))
    results = _drain([disk, remote], 2)
    assert all(r.success for r in results) and {r.direction for r in results} == {"disk_to_remote", "host_to_disk"}
    assert remote_io.records[0] == ("old", b"\x01" * kv.page_bytes)  # not the new block's 7s
    assert disk_io.records[0] == ("new", b"\x07" * kv.page_bytes)
    # And the staged copy loads back to the device byte for byte, checked against its key.
    assert remote.transfer_async(3, (RemoteLoadStoreSpec([0], ["old"]), GPULoadStoreSpec([2])))
    (r,) = _drain([remote], 1)
    assert r.success and b"".join(v[2].numpy().tobytes() for v in kv.views) == b"\x01" * kv.page_bytes
    assert remote.transfer_async(4, (RemoteLoadStoreSpec([0], ["other"]), GPULoadStoreSpec([3])))
    (r,) = _drain([remote], 1)
    assert not r.success and r.bad_block_ids == (0,)  # a record of another block is never served
    disk.close()
    remote.close()


class FailingReads(MemoryIO):
    """Reads fail with an I/O error, then find a record of another block (two causes)."""

    def read(self, slots, keys, out):
        from kvoffload.transfer.result import BlockTransferError

        self.reads += 1
        raise BlockTransferError("memory tier: boom", list(slots), io=self.reads <= 2)


def test_refused_and_failed_copies_are_logged_once_per_cause(caplog):
    from kvoffload.transfer.handler import TransferRouter

    num_blocks = 4
    kv = canonicalize([torch.randn(2, num_blocks, 4, 2, 8) for _ in range(2)], num_blocks)
    host = HostBlockBuffer(2, kv.page_bytes)
    io = FailingReads()
    tier = SecondaryTierHandler(REMOTE, io, kv, host, 1, kv.page_bytes, SlotFences(), SlotFences())
    worker = TransferRouter()
    worker.register_handler(RemoteLoadStoreSpec, GPULoadStoreSpec, tier)
    worker.register_handler(CPULoadStoreSpec, RemoteLoadStoreSpec, tier)
    caplog.set_level("WARNING")
    for job in (1, 2):  # no keys: refused (a record must name its block)
        assert not worker.transfer_async(job, (CPULoadStoreSpec([0]), RemoteLoadStoreSpec([0])))
    for job in (3, 4, 5, 6):  # two I/O failures, then two key mismatches
        assert worker.transfer_async(job, (RemoteLoadStoreSpec([0], ["k"]), GPULoadStoreSpec([1])))
        worker.wait([job])
    results = _drain([tier], 4)
    assert [r.io_error for r in sorted(results, key=lambda r: r.job_id)] == [True, True, False, False]
    lines = [r.getMessage() for r in caplog.records]
    assert sum("refused a copy" in m and "CPU -> REMOTE" in m for m in lines) == 1
    failed = [m for m in lines if "remote_to_device copy failed" in m]
    assert len(failed) == 2 and all("boom" in m for m in failed)  # I/O and bad data: two causes, once each
    tier.close()


class SlowWrites(MemoryIO):
    def __init__(self, delay_s):
        super().__init__()
        self.delay_s = delay_s

    def write(self, blocks, slots, keys):
        time.sleep(self.delay_s)
        super().write(blocks, slots, keys)


def test_a_slow_tier_write_frees_the_host_slot_at_memory_speed_and_writes_the_victims_bytes():
    num_blocks = 4
    kv = canonicalize([torch.randn(2, num_blocks, 4, 2, 8) for _ in range(2)], num_blocks)
    host = HostBlockBuffer(2, kv.page_bytes)
    host.rows(1, 1).copy_(torch.full((1, kv.page_bytes), 5, dtype=torch.uint8))  # the victim, in host slot 1
    host_fences, disk_fences = SlotFences(), SlotFences()
    disk_io = SlowWrites(1.0)
    disk = SecondaryTierHandler(DISK, disk_io, kv, host, 1, kv.page_bytes, host_fences, disk_fences)
    t0 = time.perf_counter()
    assert disk.transfer_async(1, (CPULoadStoreSpec([1]), DiskLoadStoreSpec([0], ["victim"])))
    host_fences.wait([1])  # what a store taking the slot over waits for: the staging copy only
    assert time.perf_counter() - t0 < 0.5, "the host slot was held for the tier's write"
    host.rows(1, 1).fill_(9)  # the new block lands in the slot while the victim is still being written
    (r,) = _drain([disk], 1)
    assert r.success and disk_io.records[0] == ("victim", b"\x05" * kv.page_bytes)
    disk.close()


class PieceReads(MemoryIO):
    """Each read call (one piece of a job) takes ``delay_s``; counts the pieces read."""

    def __init__(self, delay_s):
        super().__init__()
        self.delay_s = delay_s
        self.pieces = 0
        self.first = threading.Event()

    def read(self, slots, keys, out):
        self.pieces += 1
        self.first.set()
        time.sleep(self.delay_s)
        super().read(slots, keys, out)


def test_a_cancelled_load_is_reported_at_once_and_never_writes_the_device():
    """A load given up (its tier slowed down) ends at once, failed and cancelled; its thread
    stops at the next piece and the device blocks keep what they held. A load queued behind it
    and cancelled never reads at all; a load past its read cannot be cancelled."""
    from kvoffload.transfer import secondary_handler

    num_blocks = 8
    kv = canonicalize([torch.zeros(2, num_blocks, 4, 2, 8) for _ in range(2)], num_blocks)
    host = HostBlockBuffer(2, kv.page_bytes)
    io = PieceReads(0.2)
    for slot in range(6):
        io.records[slot] = (f"k{slot}", bytes([slot + 1]) * kv.page_bytes)
    handler = SecondaryTierHandler(REMOTE, io, kv, host, 1, kv.page_bytes, SlotFences(), SlotFences())
    old_piece = secondary_handler.READ_PIECE_BYTES
    secondary_handler.READ_PIECE_BYTES = kv.page_bytes  # one block a piece
    try:
        assert handler.transfer_async(1, (RemoteLoadStoreSpec([0, 1, 2, 3], ["k0", "k1", "k2", "k3"]),
                                          GPULoadStoreSpec([0, 1, 2, 3])))
        assert handler.transfer_async(2, (RemoteLoadStoreSpec([4], ["k4"]), GPULoadStoreSpec([4])))
        assert io.first.wait(5)
        t0 = time.time()
        assert handler.cancel(1) and handler.cancel(2)
        results = {r.job_id: r for r in handler.get_finished()}
        assert time.time() - t0 < 0.1  # reported at once, not after four 0.2 s pieces
        assert {j: (r.success, r.cancelled, r.nbytes) for j, r in results.items()} == {1: (False, True, 0),
                                                                                     2: (False, True, 0)}
        time.sleep(0.5)  # the first job's thread stops at its next piece; the second never reads
        assert io.pieces == 1
        assert all(not v[:6].any() for v in kv.views)  # no device block written
        assert handler.transfer_async(3, (RemoteLoadStoreSpec([5], ["k5"]), GPULoadStoreSpec([5])))
        (r,) = _drain([handler], 1)
        assert r.success and not r.cancelled and not handler.cancel(3)  # over: nothing to cancel
        assert b"".join(v[5].numpy().tobytes() for v in kv.views) == b"\x06" * kv.page_bytes
    finally:
        secondary_handler.READ_PIECE_BYTES = old_piece
        handler.close()
