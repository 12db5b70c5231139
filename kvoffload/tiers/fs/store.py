"""FsStore: the KeyValueStore contract over one or more shared cache directories.

A value is a file ``<digest of its key>.kv``, in the bucket its digest picks, in the directory
its digest picks (``paths:`` spreads blocks over drives). How files are written (under the
bucket's lock, through a temporary and a rename) and read (no lock) is ``RecordFiles``'; a
record of the wrong size cannot be a write in progress, so a read that finds one deletes it.

Statuses follow the store contract: MISSING for an absent value, BUSY when a bucket's lock
stayed taken, NO_ROOM for a record larger than a bucket; any other negative status is
``-errno`` of a failed file operation, an I/O error that counts against the tier's health.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import TypeVar

import xxhash

from kvoffload.safe_files import is_own_file, temp_name
from kvoffload.tiers.fs.bucket import RECORD_SUFFIX, Bucket, allocated
from kvoffload.tiers.fs.directory import FsDirectory
from kvoffload.tiers.fs.record_files import BUSY, MISSING, NO_ROOM, RecordWrite, record_files, touch
from kvoffload.tiers.store.kv_store import KeyValueStore

logger = logging.getLogger(__name__)

__all__ = ["BUSY", "MISSING", "NO_ROOM", "FsStore"]
_NOT_IO = {MISSING, BUSY, NO_ROOM}
T = TypeVar("T")
#: With the Python record files, batches of records at least this large are read and written on
#: the I/O threads, smaller ones in the calling thread (measured: below about 1 MiB the GIL
#: hand-offs and the file system's metadata locks cost more than the copies overlap). The native
#: files release the GIL for a whole bucket or batch: every size gains from the threads there.
PARALLEL_MIN_BYTES = 1 << 20


class FsStore(KeyValueStore):
    def __init__(self, directories: Sequence[FsDirectory], io_threads: int = 4, native: bool | None = None) -> None:
        self.directories = list(directories)
        #: Native (one C call a batch, without the GIL) where it can be built; None: so.
        self.files = record_files(native)
        #: Files of one batch are written and read in parallel (the kernel copies on every core,
        #: and a network file system overlaps round trips); 1: in the calling thread.
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="kvoffload-fs") if io_threads > 1 else None
        self.io_threads = io_threads
        self._closing = threading.Event()
        self._sweeper: threading.Thread | None = None
        roots = ", ".join(str(d.root) for d in self.directories)
        self.name = f"fs tier {roots}"

    # ---- where a key lives ---------------------------------------------------------------
    def locate(self, key: str) -> tuple[Bucket, str]:
        """The bucket a key's record lives in and the record's name there."""
        digest = xxhash.xxh3_128(key.encode()).hexdigest()
        d = self.directories[int(digest[:8], 16) % len(self.directories)]
        bucket = d.buckets[int(digest[8:16], 16) % len(d.buckets)]
        return bucket, digest + RECORD_SUFFIX

    def place(self, key: str) -> tuple[Bucket, str]:
        """The bucket and the record's path (for reports and tests: I/O goes by ``locate``)."""
        bucket, name = self.locate(key)
        return bucket, bucket.prefix + name

    def _by_bucket(self, keys: list[str]) -> Iterator[tuple[Bucket, list[tuple[int, str]]]]:
        groups: dict[int, tuple[Bucket, list[tuple[int, str]]]] = {}
        for i, key in enumerate(keys):
            bucket, name = self.locate(key)
            groups.setdefault(id(bucket), (bucket, []))[1].append((i, name))
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
            bucket, name = self.locate(key)
            try:
                out.append(int(is_own_file(os.stat(name, dir_fd=bucket.dir_fd, follow_symlinks=False))))
            except (FileNotFoundError, NotADirectoryError):
                out.append(0)  # absent (or the whole directory gone: every block is a miss)
            except OSError as exc:
                out.append(-(exc.errno or errno.EIO))
        return out

    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        return self.put_from_parts(keys, [[p] for p in ptrs], [[s] for s in sizes])

    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        return self.get_into_parts(keys, [[p] for p in ptrs], [[s] for s in sizes])

    def _fan_out(self, fn: Callable[[list[T]], None], items: list[T], record_bytes: int) -> None:
        """``fn`` over ``items``: in one chunk per I/O thread (a task per item costs more than a
        small file's copy) when the records are large enough to gain from it, else in one here."""
        k = min(self.io_threads, len(items))
        if self._pool is None or k < 2 or (record_bytes < PARALLEL_MIN_BYTES and not self.files.native):
            fn(items)
            return
        for future in [self._pool.submit(fn, items[j::k]) for j in range(k)]:
            future.result()

    def put_from_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        status = [0] * len(keys)

        def write_buckets(groups: list[tuple[Bucket, list[tuple[int, str]]]]) -> None:
            for bucket, items in groups:
                writes = [RecordWrite(name, temp_name(name[: -len(RECORD_SUFFIX)]), ptrs[i], sizes[i])
                          for i, name in items]
                for (i, _), code in zip(items, self.files.write_bucket(bucket, writes)):
                    status[i] = code

        self._fan_out(write_buckets, list(self._by_bucket(keys)), sum(sizes[0]) if sizes else 0)
        return status

    def get_into_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        status = [0] * len(keys)
        places = [self.locate(k) for k in keys]

        def read(part: list[int]) -> None:
            for i, code in zip(part, self.files.read([places[i][0].dir_fd for i in part], [places[i][1] for i in part],
                                                     [ptrs[i] for i in part], [sizes[i] for i in part])):
                status[i] = code

        self._fan_out(read, list(range(len(keys))), sum(sizes[0]) if sizes else 0)
        wrong_size = [keys[i] for i, code in enumerate(status) if code >= 0 and code != sum(sizes[i])]
        if wrong_size:
            self.remove(wrong_size)
        return status

    def touch(self, keys: list[str]) -> None:
        """Mark records recently used (their mtime), so evictions by any process keep them."""
        for key in keys:
            bucket, name = self.locate(key)
            touch(bucket.dir_fd, name)

    def remove(self, keys: list[str]) -> None:
        for bucket, items in self._by_bucket(keys):
            with suppress(OSError), bucket.locked() as held:
                for _, name in items:
                    try:
                        st = os.stat(name, dir_fd=bucket.dir_fd, follow_symlinks=False)
                        os.unlink(name, dir_fd=bucket.dir_fd)
                    except (FileNotFoundError, IsADirectoryError):
                        continue
                    if is_own_file(st):
                        held.release(allocated(st.st_size))

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
        for d in self.directories:
            d.close()

    def usage(self) -> tuple[int, int]:
        """(bytes counted, capacity) over every bucket (reads the counts without locking)."""
        used = 0
        for d in self.directories:
            for bucket in d.buckets:
                with suppress(OSError):
                    used += bucket.counted()
        return used, sum(d.capacity for d in self.directories)

