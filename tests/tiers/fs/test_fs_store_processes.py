"""FsStore with other processes and threads on its directory: a writer killed mid-write or
mid-eviction leaves the count high and every record intact, a bucket locked elsewhere turns
writes into busy (not errors), and writers killed at random instants never leave a record that
reads wrong."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from kvoffload.tiers.fs.bucket import allocated
from kvoffload.tiers.fs.directory import FsDirectory
from kvoffload.tiers.fs.store import BUSY, MISSING
from tests.tiers.fs.test_fs_store import RECORD, disk_bytes, files_impl, get, open_store, put, value  # noqa: F401


def test_a_writer_killed_mid_write_leaves_a_temporary_that_a_sweep_reclaims(tmp_path):
    """kill -9 between reserving and renaming (the Python writer, stopped at that point): the
    count stays high (never low), the temporary is never read as a record, and the next sweep
    deletes it and recounts exactly, whichever implementation reads and sweeps."""
    store = open_store(tmp_path)
    put(store, ["a"], [value(1)])
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parents[3])!r})
import kvoffload.tiers.fs.record_files as f
from tests.tiers.fs.test_fs_store import open_store, value, put
from pathlib import Path
real = f._write_all
def die(fd, parts):
    real(fd, [parts[0][:1000]])
    os.kill(os.getpid(), signal.SIGKILL)
f._write_all = die
put(open_store(Path({str(tmp_path)!r}), native=False), ["b"], [value(2)])
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    temps = list(tmp_path.rglob("*.tmp"))
    assert len(temps) == 1 and store.exists(["b"]) == [0] and get(store, ["b"])[0] == [MISSING]
    assert store.usage()[0] == 2 * allocated(RECORD)  # counted high: the bound still holds
    assert put(store, ["b"], [value(2)]) == [0]  # the dead writer's lock went with it
    store.sweep_all()
    assert list(tmp_path.rglob("*.tmp")) == [] and store.usage()[0] == disk_bytes(tmp_path) == 2 * allocated(RECORD)
    assert np.array_equal(get(store, ["b"])[1][0], value(2))


def test_a_process_killed_mid_eviction_leaves_the_count_high_and_every_record_intact(tmp_path):
    capacity = 8 * 8192
    store = open_store(tmp_path, capacity)
    put(store, [f"k{i}" for i in range(8)], [value(i) for i in range(8)])
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parents[3])!r})
import kvoffload.tiers.fs.bucket as b
from tests.tiers.fs.test_fs_store import open_store, value, put
from pathlib import Path
real = b._unlink
def die(name, dir_fd):
    real(name, dir_fd)
    os.kill(os.getpid(), signal.SIGKILL)
b._unlink = die
put(open_store(Path({str(tmp_path)!r}), {capacity}, native=False), ["new"], [value(99)])
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    left = [f"k{i}" for i, present in enumerate(store.exists([f"k{i}" for i in range(8)])) if present]
    assert len(left) == 7 and store.exists(["new"]) == [0]
    assert store.usage()[0] == capacity > disk_bytes(tmp_path)  # counted high, never low
    status, out = get(store, left)
    assert status == [RECORD] * 7 and all(np.array_equal(o, value(int(k[1:]))) for k, o in zip(left, out))
    assert put(store, ["new"], [value(99)]) == [0] and disk_bytes(tmp_path) <= capacity


def test_a_bucket_locked_by_another_process_turns_writes_into_busy_not_errors(tmp_path):
    store = open_store(tmp_path, capacity=64 * 1024)
    bucket = store.directories[0].buckets[0]
    bucket.lock_timeout_s = 0.05
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys, time
fd = os.open({str(bucket.path / '.used')!r}, os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(30)
"""], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"locked"
        assert put(store, ["k"], [value(1)]) == [BUSY] and not store.unreachable(BUSY)
        assert get(store, ["k"])[0] == [MISSING]  # reads take no lock
    finally:
        holder.kill()
        holder.wait()
    assert put(store, ["k"], [value(1)]) == [0]


def test_threads_of_one_process_take_turns_on_a_bucket(tmp_path):
    """POSIX locks do not exclude threads of one process; the bucket's own lock must."""
    capacity = 16 * 8192
    store = open_store(tmp_path, capacity)
    errors: list[int] = []

    def writer(t: int) -> None:
        for i in range(40):
            errors.extend(s for s in put(store, [f"t{t}/{i}"], [value(i)]) if s != 0)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and disk_bytes(tmp_path) <= capacity
    assert store.usage()[0] == disk_bytes(tmp_path)


def try_lock_elsewhere(counter: Path) -> bool:
    """Whether another process can take the lock on ``counter`` right now."""
    code = f"""
import fcntl, os, sys
fd = os.open({str(counter)!r}, os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(3)
"""
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_reading_counts_or_opening_the_directory_again_keeps_a_held_bucket_locked(tmp_path):
    """The usage report (another thread) opens and closes every ``.used`` file, and so does a
    second FsDirectory on the same root; a classic POSIX lock is dropped by any close of the
    file in its process, which would let another process into a bucket mid-write."""
    store = open_store(tmp_path, capacity=64 * 1024)
    bucket = store.directories[0].buckets[0]
    assert try_lock_elsewhere(bucket.counter)
    with bucket.locked():
        store.usage()
        FsDirectory(tmp_path, 64 * 1024, RECORD, "tiers[1].path")
        assert not try_lock_elsewhere(bucket.counter)
    assert try_lock_elsewhere(bucket.counter)


def test_writers_killed_at_random_instants_never_leave_a_record_that_reads_wrong(tmp_path):
    """kill -9 of a process writing records (each implementation's own writer, not stopped at a
    chosen line) at random instants, again and again: every record that exists reads back
    byte-identical, the count is never below what the directory holds, and a sweep reclaims
    the dead writers' temporaries and recounts exactly."""
    record = 256 << 10
    capacity = 48 * allocated(record)  # smaller than what the writers write: evictions run too
    store = open_store(tmp_path, capacity, record)
    native = store.files.native
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parents[3])!r})
from pathlib import Path
from tests.tiers.fs.test_fs_store import open_store, value, put
store = open_store(Path({str(tmp_path)!r}), {capacity}, {record}, native={native})
vals = [value(i, {record}) for i in range(8)]
print("ready", flush=True)
i = 0
while True:
    put(store, [f"k{{i + j}}" for j in range(8)], [vals[(i + j) % 8] for j in range(8)])
    i = (i + 8) % 400
"""
    rng = np.random.default_rng(7)
    vals = [value(i, record) for i in range(8)]
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        threading.Event().wait(float(rng.uniform(0.005, 0.15)))
        proc.kill()
        proc.wait()
        assert store.usage()[0] >= sum(allocated(p.stat().st_size) for p in tmp_path.rglob("*.kv"))
        keys = [f"k{i}" for i in range(400)]
        present = [k for k, e in zip(keys, store.exists(keys)) if e == 1]
        status, out = get(store, present, record)
        assert status == [record] * len(present)
        assert all(np.array_equal(o, vals[int(k[1:]) % 8]) for k, o in zip(present, out))
    store.sweep_all()
    assert list(tmp_path.rglob("*.tmp")) == [] and store.usage()[0] == disk_bytes(tmp_path) <= capacity
