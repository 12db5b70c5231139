"""RecordFiles: how the fs tier moves records between memory and files, a batch at a time.

A bucket's writes run under its lock: an existing record is only touched (so writers of one key
race harmlessly), a new one is counted, written to a temporary and published by ``os.replace``,
so a reader sees a whole record or none. Reads take no lock: they open, read and touch (recency
for eviction is the file's mtime) a record of the expected size; one of another size is reported
by its size and never read.

Two implementations with one behaviour: ``NativeRecordFiles`` runs each batch as one C call
without the GIL (``kvoffload_ext/fs_files.c``), ``PythonRecordFiles`` is the reference and the
fallback where no C compiler is present. Statuses follow the store contract (see ``FsStore``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from abc import ABC, abstractmethod
from contextlib import suppress
from dataclasses import dataclass

from kvoffload.errors import ConfigError
from kvoffload.tiers.fs.bucket import ALLOC_BYTES, Bucket, BucketBusyError, HeldBucket, allocated
from kvoffload_ext import fs_files

MISSING = -errno.ENOENT
BUSY = -errno.EBUSY
NO_ROOM = -errno.EFBIG
#: A read refreshes a record's mtime (its recency) when it is older than this.
TOUCH_AFTER_S = 1.0


@dataclass(slots=True)
class RecordWrite:
    """One record to write: its final path, its temporary and the memory it is made of."""

    path: str
    temp: str
    ptrs: list[int]
    sizes: list[int]


def _buffer(ptr: int, size: int) -> memoryview:
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


def _gone(exc: OSError) -> int:
    """A write's status for ``exc``: a missing directory means the whole tier's is gone."""
    return -errno.ENODEV if exc.errno in (errno.ENOENT, errno.ENOTDIR) else -(exc.errno or errno.EIO)


class RecordFiles(ABC):
    native: bool

    @abstractmethod
    def write_bucket(self, bucket: Bucket, writes: list[RecordWrite]) -> list[int]:
        """Write one bucket's records: each one's status (0, BUSY, NO_ROOM or -errno)."""

    @abstractmethod
    def read(self, paths: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        """Read whole records into their parts: the bytes read, the file's size when it differs
        from the parts' total (nothing read), MISSING, or -errno."""


class PythonRecordFiles(RecordFiles):
    native = False

    def write_bucket(self, bucket: Bucket, writes: list[RecordWrite]) -> list[int]:
        try:
            with bucket.locked() as held:
                return [self._write(held, w) for w in writes]
        except BucketBusyError:
            return [BUSY] * len(writes)
        except OSError as exc:  # the lock file cannot be opened: the directory is gone or read-only
            return [_gone(exc)] * len(writes)

    def _write(self, held: HeldBucket, w: RecordWrite) -> int:
        if os.path.exists(w.path):  # another writer's, or ours: now recently used
            with suppress(OSError):
                os.utime(w.path)
            return 0
        nbytes = allocated(sum(w.sizes))
        try:
            if not held.reserve(nbytes):
                return NO_ROOM
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        try:
            fd = os.open(w.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
            try:
                _write_all(fd, [_buffer(p, n) for p, n in zip(w.ptrs, w.sizes)])
            finally:
                os.close(fd)
            os.replace(w.temp, w.path)
            return 0
        except OSError as exc:
            with suppress(OSError):
                os.unlink(w.temp)
            with suppress(OSError):
                held.release(nbytes)
            return _gone(exc)

    def read(self, paths: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        return [self._read(p, a, s) for p, a, s in zip(paths, ptrs, sizes)]

    @staticmethod
    def _read(path: str, ptrs: list[int], sizes: list[int]) -> int:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return MISSING
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        try:
            st = os.fstat(fd)
            if st.st_size != sum(sizes):
                return st.st_size
            n = _read_all(fd, [_buffer(a, s) for a, s in zip(ptrs, sizes)])
            if time.time() - st.st_mtime > TOUCH_AFTER_S:
                with suppress(OSError):
                    os.utime(fd)  # recency, for eviction (a metadata write: not for every read of a hot record)
            return n
        except OSError as exc:
            return MISSING if exc.errno == errno.ESTALE else -(exc.errno or errno.EIO)
        finally:
            os.close(fd)


class NativeRecordFiles(PythonRecordFiles):
    """A bucket's writes or a batch's reads in one native call. What the call leaves to
    Python (records that need a sweep first, a bucket whose count is missing) takes the
    reference path, which sweeps under the same lock."""

    native = True

    def write_bucket(self, bucket: Bucket, writes: list[RecordWrite]) -> list[int]:
        try:
            with bucket.turn():
                code, status = fs_files.put_bucket(
                    str(bucket.counter), bucket.capacity, ALLOC_BYTES, bucket.lock_timeout_s,
                    [w.temp for w in writes], [w.path for w in writes], [w.ptrs for w in writes],
                    [w.sizes for w in writes])
        except BucketBusyError:
            return [BUSY] * len(writes)
        if code == fs_files.NEEDS_ROOM:
            return super().write_bucket(bucket, writes)
        if code < 0:
            return [code] * len(writes)
        later = [i for i, s in enumerate(status) if s == fs_files.NEEDS_ROOM]
        if later:
            for i, s in zip(later, super().write_bucket(bucket, [writes[i] for i in later])):
                status[i] = s
        return [0 if s == fs_files.EXISTED else s for s in status]  # -EFBIG is NO_ROOM already

    def read(self, paths: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        status = fs_files.get_records(paths, ptrs, sizes, TOUCH_AFTER_S)
        return [MISSING if s in (-errno.ENOENT, -errno.ENOTDIR, -errno.ESTALE) else s for s in status]


def record_files(native: bool | None = None) -> RecordFiles:
    """The native implementation when asked for (None: when it can be built), else Python's."""
    if native is None:
        native = fs_files.available()
    if native and not fs_files.available():
        raise ConfigError("native fs record files asked for, but kvoffload_ext/fs_files.c could not be built; "
                           "install a C compiler or pass native=False")
    return NativeRecordFiles() if native else PythonRecordFiles()


def _write_all(fd: int, parts: list[memoryview]) -> None:
    while parts:
        n = os.writev(fd, parts)
        while parts and n >= len(parts[0]):
            n -= len(parts[0])
            parts.pop(0)
        if parts and n:
            parts[0] = parts[0][n:]


def _read_all(fd: int, parts: list[memoryview]) -> int:
    total = 0
    while parts:
        n = os.readv(fd, parts)
        if n == 0:
            break
        total += n
        while parts and n >= len(parts[0]):
            n -= len(parts[0])
            parts.pop(0)
        if parts and n:
            parts[0] = parts[0][n:]
    return total
