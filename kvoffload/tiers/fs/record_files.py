"""RecordFiles: how the fs tier moves records between memory and files, a batch at a time.

A bucket's writes run under its lock: an existing record is only touched (so writers of one key
race harmlessly), a new one is counted, written to a temporary and published by ``os.replace``,
so a reader sees a whole record or none. Reads take no lock: they open, read and touch (recency
for eviction is the file's mtime) a record of the expected size; one of another size is reported
by its size and never read. Every name is resolved relative to its bucket's directory
descriptor without following symlinks; only a regular file with one link is read or touched,
anything else planted at a record's name is a miss (and a write replaces the name).

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
from kvoffload.safe_files import ForeignEntryError, create_exclusive, open_file
from kvoffload.tiers.fs.bucket import ALLOC_BYTES, COUNTER_NAME, Bucket, BucketBusyError, HeldBucket, allocated
from kvoffload_ext.fs_records import fs_files

MISSING = -errno.ENOENT
BUSY = -errno.EBUSY
NO_ROOM = -errno.EFBIG
#: A read refreshes a record's mtime (its recency) when it is older than this.
TOUCH_AFTER_S = 1.0


@dataclass(slots=True)
class RecordWrite:
    """One record to write: its name and its temporary's (in its bucket's directory) and the
    memory it is made of."""

    name: str
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
    def read(self, dir_fds: list[int], names: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        """Read whole records (``names[i]`` in directory ``dir_fds[i]``) into their parts: the
        bytes read, the file's size when it differs from the parts' total (nothing read),
        MISSING (also for a name that is not a regular file of one link), or -errno."""


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
        dir_fd = held.bucket.dir_fd
        if touch(dir_fd, w.name):  # another writer's, or ours: now recently used
            return 0
        nbytes = allocated(sum(w.sizes))
        try:
            if not held.reserve(nbytes):
                return NO_ROOM
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        try:
            fd = create_exclusive(w.temp, dir_fd)
            try:
                _write_all(fd, [_buffer(p, n) for p, n in zip(w.ptrs, w.sizes)])
            finally:
                os.close(fd)
            os.replace(w.temp, w.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return 0
        except OSError as exc:
            with suppress(OSError):
                os.unlink(w.temp, dir_fd=dir_fd)
            with suppress(OSError):
                held.release(nbytes)
            return _gone(exc)

    def read(self, dir_fds: list[int], names: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        return [self._read(d, n, a, s) for d, n, a, s in zip(dir_fds, names, ptrs, sizes)]

    @staticmethod
    def _read(dir_fd: int, name: str, ptrs: list[int], sizes: list[int]) -> int:
        try:
            fd = open_file(name, os.O_RDONLY, dir_fd)
        except (FileNotFoundError, NotADirectoryError, ForeignEntryError):
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
                    bucket.dir_fd, COUNTER_NAME, bucket.capacity, ALLOC_BYTES, bucket.lock_timeout_s,
                    [w.temp for w in writes], [w.name for w in writes], [w.ptrs for w in writes],
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

    def read(self, dir_fds: list[int], names: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        status = fs_files.get_records(dir_fds, names, ptrs, sizes, TOUCH_AFTER_S)
        return [MISSING if s in (-errno.ENOENT, -errno.ENOTDIR, -errno.ESTALE, -errno.ELOOP) else s for s in status]


def record_files(native: bool | None = None) -> RecordFiles:
    """The native implementation when asked for (None: when it can be built), else Python's."""
    if native is None:
        native = fs_files.available()
    if native and not fs_files.available():
        raise ConfigError("native fs record files asked for, but kvoffload_ext/fs_files.c could not be built; "
                           "install a C compiler or pass native=False")
    return NativeRecordFiles() if native else PythonRecordFiles()


def touch(dir_fd: int, name: str) -> bool:
    """Refresh a record's mtime (its recency): True if ``name`` is a record (a regular file of
    one link; the touch goes to the file opened, never through a link)."""
    try:
        fd = open_file(name, os.O_RDONLY, dir_fd)
    except OSError:
        return False
    try:
        with suppress(OSError):
            os.utime(fd)
        return True
    finally:
        os.close(fd)


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
