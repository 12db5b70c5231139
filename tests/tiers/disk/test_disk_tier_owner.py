"""Who opens a disk tier's file: one owner at a time (a second is refused, told which process
holds it), the worker never creates it and opens the locked one, once, across threads."""

import os
import subprocess
import sys
import textwrap

import pytest

from kvoffload.tiers.disk.format import DiskLayout
from kvoffload.tiers.disk.tier import DiskTier, DiskTierError, tier_file
from tests.tiers.disk.test_disk_tier import BLOCK_BYTES


def test_second_owner_is_refused_while_first_is_open(tmp_path):
    layout = DiskLayout("d", BLOCK_BYTES, 16, 4)
    first = DiskTier(tmp_path, layout)
    with pytest.raises(DiskTierError, match=rf"in use by process {os.getpid()} \(.*python.*\); stop that engine"):
        DiskTier(tmp_path, layout)
    first.close()
    DiskTier(tmp_path, layout).close()


def test_refusal_names_the_process_holding_the_tier(tmp_path):
    """A killed API server can leave vLLM's engine process holding the tier: the operator is
    told which process that is."""
    script = textwrap.dedent(f"""
        import sys, time
        from kvoffload.tiers.disk.format import DiskLayout
        from kvoffload.tiers.disk.tier import DiskTier
        m = DiskTier({str(tmp_path)!r}, DiskLayout("d", {BLOCK_BYTES}, 16, 4))
        print("ready", flush=True)
        time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(DiskTierError, match=rf"in use by process {holder.pid} \(.*python.*-c"):
            DiskTier(tmp_path, DiskLayout("d", BLOCK_BYTES, 16, 4))
    finally:
        holder.kill()
        holder.wait()
    DiskTier(tmp_path, DiskLayout("d", BLOCK_BYTES, 16, 4)).close()  # released with the process


def test_the_worker_never_creates_the_tier_file_and_opens_the_locked_one(tmp_path):
    """vLLM builds workers before the scheduler half: a worker that created the file would hold
    an unlocked one that `cache clear` may delete, writing on into a deleted file."""
    from kvoffload.tiers.disk.inventory import clear_files, list_files
    from kvoffload.tiers.disk.io import DiskIO

    layout = DiskLayout("d", BLOCK_BYTES, 16, 4)
    path = tier_file(tmp_path, layout)
    worker = DiskIO(layout, path)
    assert not path.exists()  # nothing created before the scheduler half locks it
    mgr = DiskTier(tmp_path, layout)
    entries, _ = list_files(tmp_path)
    removed, refused = clear_files(entries)
    assert removed == [] and len(refused) == 1  # locked from its creation on
    block = memoryview(bytearray(os.urandom(BLOCK_BYTES)))
    worker.write([block], [2], [b"k" * 16])
    assert os.fstat(worker.fd).st_ino == os.stat(path).st_ino  # the file the scheduler half holds
    out = memoryview(bytearray(BLOCK_BYTES))
    worker.read([2], [b"k" * 16], [out])
    assert bytes(out) == bytes(block)
    worker.close()
    mgr.close()


def test_a_clear_between_open_and_lock_is_noticed_and_the_file_opened_again(tmp_path, monkeypatch):
    import fcntl

    layout = DiskLayout("d", BLOCK_BYTES, 16, 4)
    path = tier_file(tmp_path, layout)
    real = fcntl.flock
    calls = []

    def clear_first(fd, op):
        if not calls:
            os.unlink(path)  # what `cache clear` does in that window: lock (free) and unlink
        calls.append(op)
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", clear_first)
    mgr = DiskTier(tmp_path, layout)
    monkeypatch.setattr(fcntl, "flock", real)
    assert len(calls) == 2  # the first lock held a deleted file: opened and locked again
    assert os.fstat(mgr._fds[0]).st_ino == os.stat(path).st_ino
    with pytest.raises(DiskTierError, match="in use by"):
        DiskTier(tmp_path, layout)
    mgr.close()


def test_the_worker_opens_its_file_once_across_threads_and_never_after_close(tmp_path):
    """Loads and stores run on threads of their own: the lazy open must not race into two
    descriptors, and a copy finishing after close must not open the file again (a leak)."""
    import threading

    from kvoffload.tiers.disk.io import DiskIO
    from kvoffload.transfer.result import BlockTransferError

    layout = DiskLayout("d", BLOCK_BYTES, 16, 4)
    mgr = DiskTier(tmp_path, layout)
    worker = DiskIO(layout, tier_file(tmp_path, layout))
    before = len(os.listdir("/proc/self/fd"))
    block = memoryview(bytearray(BLOCK_BYTES))
    start = threading.Barrier(8)

    def write(i):
        start.wait()
        worker.write([block], [i % 4], [bytes([i]) * 16])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(os.listdir("/proc/self/fd")) == before + 1
    worker.close()
    with pytest.raises(BlockTransferError, match="closed"):
        worker.write([block], [0], [b"k" * 16])
    assert len(os.listdir("/proc/self/fd")) == before
    mgr.close()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_file_deleted_or_replaced_by_another_process_is_said_at_close(tmp_path, caplog, how):
    """Round 7: another process deleting the tier's file mid-run left tokens right, but the run
    wrote an unlinked inode and its cache was gone at exit with no line saying so."""
    layout = DiskLayout("d", BLOCK_BYTES, 16, 4)
    tier = DiskTier(tmp_path, layout)
    path = tier_file(tmp_path, layout)
    os.unlink(path)
    if how == "replaced":
        path.write_bytes(b"someone else's")
    tier.close()
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and how in r.getMessage()]
    assert len(said) == 1 and "lost at exit" in said[0] and str(tmp_path) in said[0]
    caplog.clear()
    DiskTier(tmp_path / "own", layout).close()  # left alone: nothing said
    assert not [r for r in caplog.records if "lost at exit" in r.getMessage()]
