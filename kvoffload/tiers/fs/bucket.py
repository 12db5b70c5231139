"""Bucket: one slice of a shared cache directory, with its own lock and byte count.

Every process that writes to a directory takes a bucket's lock for the whole of a write (check,
reserve, write a temporary, rename), so within a bucket there is never more than one writer and
the count is exact; buckets are small (a key's hash picks one), so writers rarely meet. The
lock is a record lock on the bucket's ``.used`` file, which also holds the count: the kernel
(or the NFS lock manager) drops it when its holder dies, even by kill -9.

Every name is opened relative to the bucket's directory descriptor without following symlinks
(``kvoffload.safe_files``): a co-tenant who plants a link at ``.used`` or a record's name
cannot make this process write outside the directory; a planted counter is removed and remade.

The count is raised before a record is written and lowered after one is deleted, so a process
killed between the two leaves it too high, never too low: the bucket can only hold less than
its share, never more. Any sweep (an eviction, or the one-off sweep a process runs at start)
recounts exactly and deletes temporaries: under the lock, every temporary is a dead writer's.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from kvoffload.safe_files import ForeignEntryError, is_own_file, note_foreign, open_file, read_file, remove_entry

#: Files are counted at their size rounded up to this (the allocation unit of common file systems).
ALLOC_BYTES = 4096
RECORD_SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"
#: An eviction frees the bucket down to this share of its capacity, so one scan serves many writes.
LOW_WATERMARK = 0.9
#: A bucket's ``.used`` file: its byte count, little-endian.
COUNTER_BYTES = 8
#: ``struct flock`` (64-bit Linux) for an exclusive lock on a whole file; l_pid 0, as OFD locks need.
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_ofd = hasattr(fcntl, "F_OFD_SETLK")


def allocated(size: int) -> int:
    return -(-size // ALLOC_BYTES) * ALLOC_BYTES


class BucketBusyError(OSError):
    """The bucket's lock was not free within the timeout (another process is writing there)."""


COUNTER_NAME = ".used"


class Bucket:
    """``dir_fd``: the bucket directory, opened once (a name swapped for a symlink later is
    never followed: every file is opened relative to it)."""

    def __init__(self, path: Path, dir_fd: int, capacity: int, lock_timeout_s: float = 2.0) -> None:
        self.path = path
        self.dir_fd = dir_fd
        self.prefix = f"{path}{os.sep}"  # for messages and tests: record names are relative to dir_fd
        self.capacity = capacity
        self.lock_timeout_s = lock_timeout_s
        self._counter = path / COUNTER_NAME
        self._threads = threading.Lock()  # POSIX locks are per process: this process's threads queue here
        self.num_evicted = 0
        self.num_temps_reclaimed = 0

    @property
    def counter(self) -> Path:
        """The ``.used`` file: the bucket's lock and count."""
        return self._counter

    def counted(self) -> int:
        """The bucket's count as last written, read without the lock (for reports: a write in
        progress may change it the next moment); 0 when there is none yet."""
        try:
            return _decode(read_file(COUNTER_NAME, self.dir_fd, COUNTER_BYTES))
        except ForeignEntryError:
            return 0

    def open_counter(self) -> int:
        """The ``.used`` file, opened read-write (created when missing); a planted entry there
        (symlink, FIFO, hard link, directory) is removed and a fresh counter created instead."""
        try:
            return open_file(COUNTER_NAME, os.O_RDWR | os.O_CREAT, self.dir_fd)
        except ForeignEntryError as exc:
            note_foreign(str(self.path), exc)
            remove_entry(COUNTER_NAME, self.dir_fd)
            return open_file(COUNTER_NAME, os.O_RDWR | os.O_CREAT, self.dir_fd)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """This process's turn at the bucket: its threads queue here (cheaper than polling the
        file lock, which excludes them too)."""
        if not self._threads.acquire(timeout=self.lock_timeout_s):
            raise BucketBusyError(errno.EBUSY, "bucket busy in this process", str(self.path))
        try:
            yield
        finally:
            self._threads.release()

    @contextmanager
    def locked(self) -> Iterator[HeldBucket]:
        with self.turn():
            fd = self.open_counter()
            try:
                deadline = time.monotonic() + self.lock_timeout_s
                while not lock_file(fd):
                    if time.monotonic() > deadline:
                        raise BucketBusyError(errno.EBUSY, "bucket locked by another process", str(self.path))
                    time.sleep(0.0005)
                yield HeldBucket(self, fd)
            finally:
                os.close(fd)  # releases the lock


class HeldBucket:
    """A bucket while this process holds its lock: the count, reservations and sweeps."""

    def __init__(self, bucket: Bucket, fd: int) -> None:
        self.bucket = bucket
        self._fd = fd

    def used(self) -> int:
        raw = os.pread(self._fd, COUNTER_BYTES, 0)
        if len(raw) < COUNTER_BYTES:  # a new bucket, or a counter lost: count what is there
            return self.sweep()
        return _decode(raw)

    def _set_used(self, nbytes: int) -> None:
        os.pwrite(self._fd, max(0, nbytes).to_bytes(COUNTER_BYTES, "little"), 0)

    def reserve(self, nbytes: int) -> bool:
        """Count ``nbytes`` about to be written, evicting the oldest records if they do not fit;
        False if they cannot fit even in an empty bucket."""
        cap = self.bucket.capacity
        if nbytes > cap:
            return False
        used = self.used()
        if used + nbytes > cap:
            used = self.sweep(target=max(0, int(cap * LOW_WATERMARK) - nbytes))
            if used + nbytes > cap:
                return False
        self._set_used(used + nbytes)
        return True

    def release(self, nbytes: int) -> None:
        """Uncount ``nbytes`` deleted (or never written after ``reserve``)."""
        self._set_used(self.used() - nbytes)

    def sweep(self, target: int | None = None) -> int:
        """Recount the bucket exactly, delete temporaries (dead writers') and, with ``target``,
        the least recently used records until at most ``target`` bytes remain. Returns the count.
        A reader with a record open keeps reading it: unlinking removes the name, not the data."""
        records: list[tuple[int, int, str]] = []
        dir_fd = self.bucket.dir_fd
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if entry.name.endswith(TEMP_SUFFIX):
                    _unlink(entry.name, dir_fd)
                    self.bucket.num_temps_reclaimed += 1
                elif entry.name.endswith(RECORD_SUFFIX):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if is_own_file(st):
                        records.append((st.st_mtime_ns, allocated(st.st_size), entry.name))
                    else:  # planted: a link or FIFO is never a record (only the name goes)
                        with suppress(OSError):
                            remove_entry(entry.name, dir_fd)
        total = sum(size for _, size, _ in records)
        if target is not None and total > target:
            records.sort()
            for _, size, path in records:
                if total <= target:
                    break
                _unlink(path, dir_fd)
                total -= size
                self.bucket.num_evicted += 1
        self._set_used(total)
        return total


def lock_file(fd: int) -> bool:
    """Take an exclusive lock on the whole of ``fd``'s file without waiting: True if taken,
    False if another holder has it. An open-file-description lock where the kernel has them:
    closing some other descriptor of the file in this process (a report reading the count)
    does not drop it, as it would a classic POSIX lock; classic locks are the fallback."""
    global _ofd
    while True:
        try:
            if _ofd:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
            else:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if _ofd and exc.errno == errno.EINVAL:
                _ofd = False  # a kernel without OFD locks
                continue
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise


def _decode(raw: bytes) -> int:
    """A ``.used`` file's count (0 for a file shorter than one)."""
    return int.from_bytes(raw[:COUNTER_BYTES], "little") if len(raw) >= COUNTER_BYTES else 0


def _unlink(name: str, dir_fd: int) -> None:
    with suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(name, dir_fd=dir_fd)
