"""FsDirectory: one cache directory of the fs tier, as every process sharing it sees it.

``<root>/kvoffload-fs.json`` fixes, once, how many buckets the directory has (the first process
writes it, atomically; the others read it), so every process locks and counts the same slices.
Each bucket is a subdirectory ``bNN`` holding ``<key digest>.kv`` records and its ``.used`` lock
and count; the directory's capacity is split evenly over its buckets. A key's digest picks its
bucket, so the buckets fill alike and evicting each one's oldest records approximates LRU over
the whole directory.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import uuid
from pathlib import Path

from kvoffload.config import format_bytes
from kvoffload.errors import ConfigError
from kvoffload.tiers.fs.bucket import Bucket, BucketBusyError, allocated

logger = logging.getLogger(__name__)

META_NAME = "kvoffload-fs.json"
FORMAT = 1
MAX_BUCKETS = 256
#: A bucket should hold at least this many records, or per-bucket LRU drifts from global LRU.
RECORDS_PER_BUCKET = 64


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
        try:
            root.mkdir(parents=True, exist_ok=True)
            n = self._bucket_count(bucket_count(capacity, record_bytes), capacity)
            share = capacity // n
            if share < allocated(record_bytes):
                raise ConfigError(
                    f"{key}: {format_bytes(capacity)} over the {n} buckets of {root} leaves "
                    f"{format_bytes(share)} each, less than one {format_bytes(allocated(record_bytes))} record; "
                    f"raise capacity to at least {format_bytes(n * allocated(record_bytes) * RECORDS_PER_BUCKET)} "
                    "or use a fresh directory")
            self.buckets = [Bucket(root / f"b{i:02x}", share) for i in range(n)]
            for b in self.buckets:
                b.path.mkdir(exist_ok=True)
            self._check_locks()
        except OSError as exc:
            raise ConfigError(f"{key}: {str(root)[:200]!r} is not usable ({exc.strerror or exc}); give a writable "
                              "directory") from None

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
        if not meta.exists():
            temp = self.root / f".{META_NAME}.{uuid.uuid4().hex}.tmp"
            temp.write_text(json.dumps({"format": FORMAT, "buckets": proposed, "capacity": capacity}) + "\n")
            try:
                os.link(temp, meta)  # atomic and exclusive, on local and network file systems alike
            except FileExistsError:
                pass  # another process created it first: its choice stands
            finally:
                temp.unlink()
        try:
            data = json.loads(meta.read_text())
            n = data["buckets"]
            ok = data["format"] == FORMAT and isinstance(n, int) and 1 <= n <= MAX_BUCKETS and n & (n - 1) == 0
        except (ValueError, KeyError, TypeError):
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
