"""Digests of whole weight files, computed once and cached by the file's identity.

A KV block is only as right as every weight that computed it: a merged LoRA, a targeted edit or
one re-quantised layer rewrites a few megabytes in the middle of a multi-gigabyte shard, which a
sampled fingerprint misses (64 samples of a 5 GB shard lie ~78 MB apart). So every byte is
hashed (xxh3-128, several GB/s), once per file version: the digest is kept in the per-user cache
directory under the file's resolved path, with the file's size, mtime, ctime, inode and device,
and recomputed whenever any of them changes (an in-place write changes mtime and ctime; a
replacement changes the inode; ``touch -d`` to fake an mtime still moves the ctime).

On a file system with coarse timestamps (a second on ext3 or some NFS servers, two on FAT), a
same-size rewrite within the tick after hashing would keep the identity: a digest is cached
only for a file last changed more than ``RECENT_S`` ago (git's "racily clean" rule); a file
younger than that is hashed again at every start until it is older.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import xxhash

from kvoffload.safe_files import open_file, read_file, replace_file

logger = logging.getLogger(__name__)

_CHUNK = 8 << 20
#: A file changed less than this long ago may still change within its timestamp's tick.
RECENT_S = 3.0
#: Wall-clock time in ns (the file system's clock), replaceable in tests.
_now_ns = time.time_ns
#: A checkpoint slower than this to hash gets an info line (its digest is cached afterwards).
_SLOW_S = 2.0


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What changes when a file's bytes may have: any difference means hash again."""

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        st = os.stat(path)
        return cls(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


#: Files whose every byte enters the fingerprint.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weights_fingerprint(path: str | os.PathLike[str], cache_dir: Path | None) -> str:
    """A digest of every byte of a checkpoint directory's weight files (the config is its own
    component); "" if ``path`` is not a directory (the caller then names the weights by a
    revision id). ``cache_dir``: where file digests are kept (None: hashed every time)."""
    return _directory_digest("full", path, WEIGHT_SUFFIXES, cache_dir)


def adapter_fingerprint(path: str | os.PathLike[str], cache_dir: Path | None) -> str:
    """A digest of every byte of an adapter directory's weights and its JSON configs (a LoRA's
    rank, alpha and target modules change the KV as much as its weights); "" if ``path`` is
    not a directory."""
    return _directory_digest("adapter", path, (*WEIGHT_SUFFIXES, ".json"), cache_dir)


def _directory_digest(kind: str, path: str | os.PathLike[str], suffixes: tuple[str, ...],
                      cache_dir: Path | None) -> str:
    root = Path(path)
    if not root.is_dir():
        return ""
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(suffixes))
    return f"{kind}:" + files_digest(files, cache_dir)


def file_digest(path: Path, cache_dir: Path | None) -> str:
    """The xxh3-128 of every byte of ``path``, from ``cache_dir`` when the file is unchanged.
    Processes starting together (vLLM's scheduler and each worker) hash a file once: the first
    holds the entry's lock while it hashes, the others then read its result."""
    ident = FileIdentity.of(path)
    if cache_dir is None:
        return hash_file(path)
    entry = cache_dir / (hashlib.sha256(ident.path.encode()).hexdigest()[:24] + ".json")
    cached = _cached(entry, ident)
    if cached is not None:
        return cached
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = open_file(entry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, mode=0o600)
    except OSError:
        lock = -1  # no cache directory to write: hash without sharing the result
    try:
        if lock >= 0:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cached = _cached(entry, ident)
            if cached is not None:
                return cached
        digest = hash_file(path)
        if FileIdentity.of(path) != ident:
            return f"changing:{digest}"  # written while hashed: a mixture, never cached
        if _now_ns() - max(ident.mtime_ns, ident.ctime_ns) < RECENT_S * 1e9:
            return digest  # a rewrite within this tick would not change the identity: not cached
        try:
            replace_file(entry, json.dumps({"identity": asdict(ident), "xxh3_128": digest}).encode(), mode=0o600)
        except OSError as exc:
            logger.debug("kvoffload: cannot cache the digest of %s in %s (%s): it is hashed again next start", path,
                         cache_dir, exc.strerror)
        return digest
    finally:
        if lock >= 0:
            os.close(lock)


def _cached(entry: Path, ident: FileIdentity) -> str | None:
    try:
        saved = json.loads(read_file(entry))
        if saved.get("identity") == asdict(ident) and isinstance(saved.get("xxh3_128"), str):
            return str(saved["xxh3_128"])
    except (OSError, ValueError, AttributeError):
        pass
    return None


def hash_file(path: Path) -> str:
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def files_digest(files: list[Path], cache_dir: Path | None) -> str:
    """One digest over ``files`` (their names and whole-content digests), logging the time taken
    when some had to be hashed and that was slow."""
    start = time.perf_counter()
    h = xxhash.xxh3_128()
    for f in files:
        h.update(f.name.encode() + b"\0" + file_digest(f, cache_dir).encode() + b"\0")
    took = time.perf_counter() - start
    if took > _SLOW_S:
        total = sum(f.stat().st_size for f in files)
        logger.info("kvoffload: hashed %d weight file(s), %.1f GB, in %.1f s for the offload namespace (cached by "
                    "file identity: later starts only stat them)", len(files), total / 1e9, took)
    return h.hexdigest()
