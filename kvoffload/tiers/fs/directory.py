"""FsDirectory: one cache directory of the fs tier, as every process sharing it sees it.

``<root>/kvoffload-fs.json`` fixes, once, how many buckets the directory has (the first process
writes it, atomically; the others read it), so every process locks and counts the same slices.
Each bucket is a subdirectory ``bNN`` holding ``<key digest>.kv`` records and its ``.used`` lock
and count; the directory's capacity is split evenly over its buckets. A key's digest picks its
bucket, so the buckets fill alike and evicting each one's oldest records approximates LRU over
the whole directory.

The directory and its buckets are opened once, as descriptors: every later name is resolved
relative to them without following symlinks, so whoever else can write the directory cannot
redirect this process's writes outside it (a planted bucket link is refused at start).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import weakref
from contextlib import suppress
from pathlib import Path

from kvoffload.config import default_cache_dir, format_bytes
from kvoffload.errors import ConfigError
from kvoffload.safe_files import (
    ForeignEntryError,
    create_exclusive,
    open_dir,
    read_file,
    temp_name,
    warn_if_shared_with_others,
)
from kvoffload.tiers.fs.bucket import Bucket, BucketBusyError, allocated

logger = logging.getLogger(__name__)

META_NAME = "kvoffload-fs.json"
FORMAT = 1
MAX_BUCKETS = 256
#: A bucket should hold at least this many records, or per-bucket LRU drifts from global LRU.
RECORDS_PER_BUCKET = 64


def may_create_parents(root: Path) -> bool:
    """Whether the directory's missing parents may be created: inside the user's home or cache
    directory (a demo's private "shared" directory). Anywhere else only the leaf is created, in
    an existing directory: a shared file system's mount point is never made on the local disk."""
    mine = (Path.home(), default_cache_dir())
    return any(root == base or base in root.parents for base in mine)


def missing_mount(key: str, root: Path) -> str:
    """The error for a shared directory whose parent is absent (a file system not mounted)."""
    return (f"{key}: {str(root)[:200]!r} does not exist and neither does its parent: is the shared file system "
            "mounted? Mount it, or create the directory, first (an fs tier never creates its parents: an "
            "unmounted share would become a local directory each replica caches in alone)")


def bucket_count(capacity: int, record_bytes: int) -> int:
    """The number of buckets a new directory gets: a power of two, at most 256, each holding
    at least RECORDS_PER_BUCKET records of this size (1 for a small capacity)."""
    records = capacity // allocated(record_bytes)
    n = 1
    while n * 2 <= MAX_BUCKETS and records // (n * 2) >= RECORDS_PER_BUCKET:
        n *= 2
    return n


class FsDirectory:
    def __init__(self, root: Path, capacity: int, record_bytes: int, key: str) -> None:
        self.root = root
        self.key = key
        self._fds: list[int] = []
        self._closer = weakref.finalize(self, _close_all, self._fds)
        try:
            if not root.is_dir():
                if not may_create_parents(root) and not root.parent.is_dir():
                    raise ConfigError(missing_mount(key, root))
                root.mkdir(parents=True, exist_ok=True)
            self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._fds.append(self.root_fd)
            warn_if_shared_with_others(root, f"{key}: the fs tier directory")
            n = self._bucket_count(bucket_count(capacity, record_bytes), capacity)
            share = capacity // n
            if share < allocated(record_bytes):
                raise ConfigError(
                    f"{key}: {format_bytes(capacity)} over the {n} buckets of {root} leaves "
                    f"{format_bytes(share)} each, less than one {format_bytes(allocated(record_bytes))} record; "
                    f"raise capacity to at least {format_bytes(n * allocated(record_bytes) * RECORDS_PER_BUCKET)} "
                    "or use a fresh directory")
            _make_fd_room(n, key)
            self.buckets = [self._open_bucket(f"b{i:02x}", share) for i in range(n)]
            self._check_locks()
        except ForeignEntryError as exc:
            self.close()
            raise ConfigError(f"{key}: {root / str(exc.filename)} is {exc.strerror}: someone else writes {root}; "
                              "remove that entry and give the directory to the engines' user alone") from None
        except OSError as exc:
            self.close()
            raise ConfigError(f"{key}: {str(root)[:200]!r} is not usable ({exc.strerror or exc}); give a writable "
                              "directory") from None
        except BaseException:
            self.close()
            raise

    def _open_bucket(self, name: str, share: int) -> Bucket:
        with suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=self.root_fd)
        fd = open_dir(name, self.root_fd)
        self._fds.append(fd)
        return Bucket(self.root / name, fd, share)

    def close(self) -> None:
        """Close the directory's descriptors (also done when it is garbage-collected)."""
        self._closer()

    def _check_locks(self) -> None:
        """Sharing is safe only where POSIX locks work: refuse a file system without them."""
        try:
            with self.buckets[0].locked():
                pass
        except BucketBusyError:
            pass  # another process holds it: locks work
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise ConfigError(f"{self.key}: {self.root} does not support POSIX locks ({exc.strerror}); mount it "
                                  "with locking (NFS: without nolock; Lustre: -o flock) or use another "
                                  "directory") from None
            raise

    def _bucket_count(self, proposed: int, capacity: int) -> int:
        meta = self.root / META_NAME
        fd = self.root_fd
        try:
            os.stat(META_NAME, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            temp = temp_name(f".{META_NAME}")
            out = create_exclusive(temp, fd)
            with os.fdopen(out, "w") as f:
                f.write(json.dumps({"format": FORMAT, "buckets": proposed, "capacity": capacity}) + "\n")
            try:  # atomic and exclusive, on local and network file systems alike
                os.link(temp, META_NAME, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass  # another process created it first: its choice stands
            finally:
                os.unlink(temp, dir_fd=fd)
        try:
            data = json.loads(read_file(META_NAME, fd, 1 << 16))
            n = data["buckets"]
            ok = data["format"] == FORMAT and isinstance(n, int) and 1 <= n <= MAX_BUCKETS and n & (n - 1) == 0
        except (ValueError, KeyError, TypeError, ForeignEntryError):
            ok = False
        if not ok:
            raise ConfigError(f"{self.key}: {meta} is not a kvoffload fs directory description (format {FORMAT}); "
                              "point the tier at another directory, or delete the file if the directory is ours")
        first = data.get("capacity")
        if isinstance(first, int) and first != capacity:
            # Each process bounds the directory by its own capacity: the largest one holds, and a
            # process with a smaller one evicts down to it whenever it writes.
            logger.warning("kvoffload: %s: %s was created with capacity %s, this process bounds it at %s: the "
                           "directory may hold up to the larger, and smaller ones evict more; give every process "
                           "sharing it the same capacity", self.key, self.root, format_bytes(first),
                           format_bytes(capacity))
        return int(n)

    @property
    def capacity(self) -> int:
        return sum(b.capacity for b in self.buckets)


def _make_fd_room(n: int, key: str) -> None:
    """Each bucket is held open: raise the soft limit on open files towards the hard one when
    ``n`` more would come near it (vLLM raises it likewise), else say what to raise."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    needed = in_use + n + 256
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed * 2 if hard == resource.RLIM_INFINITY else min(hard, needed * 2)
    if target >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return
    raise ConfigError(f"{key}: the fs tier holds its {n} bucket directories open and this process may open only "
                      f"{soft} files ({in_use} in use, hard limit {hard}); raise `ulimit -n` to at least {needed}")


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()
