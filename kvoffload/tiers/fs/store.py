"""FsStore: the KeyValueStore contract over one or more shared cache directories.

A value is a file ``<digest of its key>.kv``, in the bucket its digest picks, in the directory
its digest picks (``paths:`` spreads blocks over drives). A write runs under the bucket's lock:
an existing record is only touched (so writers of one key race harmlessly), a new one is
counted, written to a temporary and published by ``os.replace``, so a reader sees a whole
record or none. Reads take no lock: they open, read and touch (recency for eviction is the
file's mtime). A record of the wrong size cannot be a write in progress, so it is deleted.

Statuses follow the store contract: MISSING for an absent value, BUSY when a bucket's lock
stayed taken, NO_ROOM for a record larger than a bucket; any other negative status is
``-errno`` of a failed file operation, an I/O error that counts against the tier's health.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import TypeVar

import xxhash

from kvoffload.kv_store import KeyValueStore
from kvoffload.tiers.fs.bucket import RECORD_SUFFIX, TEMP_SUFFIX, Bucket, BucketBusyError, HeldBucket, allocated
from kvoffload.tiers.fs.directory import FsDirectory

logger = logging.getLogger(__name__)

MISSING = -errno.ENOENT
BUSY = -errno.EBUSY
NO_ROOM = -errno.EFBIG
_NOT_IO = {MISSING, BUSY, NO_ROOM}
T = TypeVar("T")
#: A read refreshes a record's mtime (its recency) when it is older than this.
TOUCH_AFTER_S = 1.0
#: Batches of records at least this large are read and written on the I/O threads; smaller
#: ones in the calling thread (measured: below about 1 MiB the hand-off and the file system's
#: metadata locks cost more than the copies overlap).
PARALLEL_MIN_BYTES = 1 << 20


def _buffer(ptr: int, size: int) -> memoryview:
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


class FsStore(KeyValueStore):
    def __init__(self, directories: Sequence[FsDirectory], io_threads: int = 4) -> None:
        self.directories = list(directories)
        #: Files of one batch are written and read in parallel (the kernel copies on every core,
        #: and a network file system overlaps round trips); 1: in the calling thread.
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="kvoffload-fs") if io_threads > 1 else None
        self.io_threads = io_threads
        self._closing = threading.Event()
        self._sweeper: threading.Thread | None = None
        roots = ", ".join(str(d.root) for d in self.directories)
        self.name = f"fs tier {roots}"
        self._temp_tag = f".{os.getpid()}{TEMP_SUFFIX}"

    # ---- where a key lives ---------------------------------------------------------------
    def place(self, key: str) -> tuple[Bucket, str]:
        digest = xxhash.xxh3_128(key.encode()).hexdigest()
        d = self.directories[int(digest[:8], 16) % len(self.directories)]
        bucket = d.buckets[int(digest[8:16], 16) % len(d.buckets)]
        return bucket, os.path.join(bucket.path, digest + RECORD_SUFFIX)

    def _by_bucket(self, keys: list[str]) -> Iterator[tuple[Bucket, list[tuple[int, str]]]]:
        groups: dict[int, tuple[Bucket, list[tuple[int, str]]]] = {}
        for i, key in enumerate(keys):
            bucket, path = self.place(key)
            groups.setdefault(id(bucket), (bucket, []))[1].append((i, path))
        yield from groups.values()

    # ---- the store contract --------------------------------------------------------------
    @property
    def needs_registration(self) -> bool:
        return False  # files are read into and written from any host memory

    def unreachable(self, status: int) -> bool:
        return status < 0 and status not in _NOT_IO

    def exists(self, keys: list[str]) -> list[int]:
        out = []
        for key in keys:
            try:
                os.stat(self.place(key)[1])
                out.append(1)
            except (FileNotFoundError, NotADirectoryError):
                out.append(0)  # absent (or the whole directory gone: every block is a miss)
            except OSError as exc:
                out.append(-(exc.errno or errno.EIO))
        return out

    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        return self.put_from_parts(keys, [[p] for p in ptrs], [[s] for s in sizes])

    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        return self.get_into_parts(keys, [[p] for p in ptrs], [[s] for s in sizes])

    def _fan_out(self, fn: Callable[[T], None], items: list[T], record_bytes: int) -> None:
        """``fn`` over ``items``, in one chunk per I/O thread (a task per item costs more than a
        small file's copy) when the records are large enough to gain from it."""
        k = min(self.io_threads, len(items))
        if self._pool is None or k < 2 or record_bytes < PARALLEL_MIN_BYTES:
            for item in items:
                fn(item)
            return

        def chunk(part: list[T]) -> None:
            for item in part:
                fn(item)

        for future in [self._pool.submit(chunk, items[j::k]) for j in range(k)]:
            future.result()

    def put_from_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        status = [0] * len(keys)

        def write_bucket(group: tuple[Bucket, list[tuple[int, str]]]) -> None:
            bucket, items = group
            try:
                with bucket.locked() as held:
                    for i, path in items:
                        status[i] = self._write(held, path, ptrs[i], sizes[i])
            except BucketBusyError:
                for i, _ in items:
                    status[i] = BUSY
            except OSError as exc:  # the lock file cannot be opened: the directory is gone or read-only
                code = -errno.ENODEV if exc.errno == errno.ENOENT else -(exc.errno or errno.EIO)
                for i, _ in items:
                    status[i] = code

        self._fan_out(write_bucket, list(self._by_bucket(keys)), sum(sizes[0]) if sizes else 0)
        return status

    def _write(self, held: HeldBucket, path: str, ptrs: list[int], sizes: list[int]) -> int:
        if os.path.exists(path):  # another writer's, or ours: now recently used
            with suppress(OSError):
                os.utime(path)
            return 0
        nbytes = allocated(sum(sizes))
        try:
            if not held.reserve(nbytes):
                return NO_ROOM
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        temp = path[: -len(RECORD_SUFFIX)] + self._temp_tag
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                _write_all(fd, [_buffer(p, n) for p, n in zip(ptrs, sizes)])
            finally:
                os.close(fd)
            os.replace(temp, path)
            return 0
        except OSError as exc:
            with suppress(OSError):
                os.unlink(temp)
            with suppress(OSError):
                held.release(nbytes)
            return -errno.ENODEV if exc.errno == errno.ENOENT else -(exc.errno or errno.EIO)

    def get_into_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        status = [0] * len(keys)
        wrong_size: list[str] = []

        def read(i: int) -> None:
            status[i] = self._read(self.place(keys[i])[1], ptrs[i], sizes[i])
            if status[i] >= 0 and status[i] != sum(sizes[i]):
                wrong_size.append(keys[i])

        self._fan_out(read, list(range(len(keys))), sum(sizes[0]) if sizes else 0)
        if wrong_size:
            self.remove(wrong_size)
        return status

    @staticmethod
    def _read(path: str, ptrs: list[int], sizes: list[int]) -> int:
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return MISSING
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        try:
            st = os.fstat(fd)
            if st.st_size != sum(sizes):
                return st.st_size  # not a record of this layout, or torn: never served (and deleted)
            n = _read_all(fd, [_buffer(a, s) for a, s in zip(ptrs, sizes)])
            if time.time() - st.st_mtime > TOUCH_AFTER_S:
                with suppress(OSError):
                    os.utime(fd)  # recency, for eviction (a metadata write: not for every read of a hot record)
            return n
        except OSError as exc:
            return MISSING if exc.errno == errno.ESTALE else -(exc.errno or errno.EIO)
        finally:
            os.close(fd)

    def touch(self, keys: list[str]) -> None:
        """Mark records recently used (their mtime), so evictions by any process keep them."""
        for key in keys:
            with suppress(OSError):
                os.utime(self.place(key)[1])

    def remove(self, keys: list[str]) -> None:
        for bucket, items in self._by_bucket(keys):
            with suppress(OSError), bucket.locked() as held:
                for _, path in items:
                    try:
                        size = os.stat(path).st_size
                        os.unlink(path)
                    except FileNotFoundError:
                        continue
                    held.release(allocated(size))

    # ---- upkeep --------------------------------------------------------------------------
    def start_sweep(self) -> None:
        """``sweep_all`` on a thread of its own (``close`` stops and joins it)."""
        self._sweeper = threading.Thread(target=self.sweep_all, name="kvoffload-fs-sweep", daemon=True)
        self._sweeper.start()

    def sweep_all(self) -> None:
        """Recount every bucket and reclaim dead writers' temporaries (run once at start, off the
        critical path). A bucket that cannot be locked or read is left for its next eviction."""
        for d in self.directories:
            for bucket in d.buckets:
                if self._closing.is_set():
                    return
                try:
                    with bucket.locked() as held:
                        held.sweep()
                except OSError as exc:
                    logger.debug("%s: sweep of %s skipped (%s)", self.name, bucket.path, exc)

    def close(self) -> None:
        self._closing.set()
        if self._sweeper is not None:
            self._sweeper.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def usage(self) -> tuple[int, int]:
        """(bytes counted, capacity) over every bucket (reads the counts without locking)."""
        used = 0
        for d in self.directories:
            for bucket in d.buckets:
                with suppress(OSError):
                    used += bucket.counted()
        return used, sum(d.capacity for d in self.directories)


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
