"""DiskTier: the block ledger of a local-disk tier that survives restarts.

Scheduler-side and tensor-free: a LedgerTier over disk slots, like the host tier, plus the
file: created and preallocated on first use, locked against a second concurrent owner, and
scanned on open so every intact record is served again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

from kvoffload.config import default_cache_dir, format_bytes
from kvoffload.errors import ConfigError
from kvoffload.namespace import KVNamespace
from kvoffload.offload.ledger_tier import LedgerTier
from kvoffload.offload.mediums import DiskLoadStoreSpec
from kvoffload.offload.policy import CachePolicy
from kvoffload.offload.tier_report import TierReport
from kvoffload.registry import PolicyRef
from kvoffload.safe_files import ForeignEntryError, open_file, read_file, replace_file, warn_if_shared_with_others
from kvoffload.tiers.disk.format import HEADER_BYTES, DiskLayout, parse_file_header, scan_records

logger = logging.getLogger(__name__)


class DiskTierError(OSError):
    """The disk tier cannot start (path in use, disk full, not writable); the message says why."""


def capacity_past_free_space(capacity: str, free: str) -> str:
    """One message for a tier larger than its file system's free space, from ``config check``
    and from the engine alike (a warning in both: the file is sparse, and fails only as it fills)."""
    return (f"capacity {capacity} exceeds the {free} free on its file system; writes will fail (ENOSPC) and take "
            "the tier out of service once it fills: lower the tier's capacity or free space")


def tier_file(path: str | Path, layout: DiskLayout) -> Path:
    suffix = "" if layout.world_size == 1 else f"-rank{layout.rank}of{layout.world_size}"
    return Path(path) / f"kvoffload-{layout.digest}-{layout.block_bytes}{suffix}.kvdata"


#: Beside each tier's files, the components its namespace covers (``KVNamespace.as_dict``) and
#: the namespace digest, named like the tier files: by the tier digest (the namespace folded with
#: the secret's id), so a file and its namespace file always go together.
NAMESPACE_GLOB = "kvoffload-*.namespace.json"
#: The namespace file's entry holding the namespace digest (the rest are its components).
NAMESPACE_KEY = "namespace"
#: The namespace file's entry naming the model as a person would (not a component of the digest).
LABEL_KEY = "label"


def namespace_file(directory: Path, tier_digest: str) -> Path:
    return directory / f"kvoffload-{tier_digest}.namespace.json"


def sidecar_digest(path: Path) -> str:
    """The tier digest a ``namespace_file`` is named by."""
    return path.name[len("kvoffload-"):-len(".namespace.json")]


def read_namespace_files(directory: Path) -> dict[str, dict[str, str]]:
    """Every readable namespace file in ``directory``: tier digest -> its entries (components,
    and the namespace digest under ``NAMESPACE_KEY``). Never read through a link or a FIFO."""
    out: dict[str, dict[str, str]] = {}
    for side in sorted(directory.glob(NAMESPACE_GLOB)):
        try:
            data = json.loads(read_file(side))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out[sidecar_digest(side)] = {str(k): str(v) for k, v in data.items()}
    return out


def same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` (not followed) still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def lock_holder(path: Path) -> str:
    """Who holds the lock on ``path``, from /proc/locks: "process 1234 (python3 -m vllm...)"."""
    return find_lock_holder(path) or "another process"


def find_lock_holder(path: Path) -> str | None:
    """The process holding an flock on ``path`` ("process 1234 (cmdline)"), None when none
    does (or /proc/locks cannot tell)."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and "FLOCK" in fields and inode in fields:
            pid = next((f for f in fields[4:6] if f.isdigit()), "")
            if pid:
                return f"process {pid} ({_cmdline(pid)})"
    return None


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "command unknown"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    return text[:120] or "command unknown"


def prepare_tier_dir(path: str | Path, key: str = "tiers[1].path") -> Path:
    """Create the leaf directory if its parent exists; fail clearly otherwise. The per-user cache
    directory (:func:`default_cache_dir`) is ours: it is created with its parents, private to its
    user, as on a fresh HOME without ``~/.cache``."""

    p = Path(path)
    if not p.exists():
        ours = p == default_cache_dir()
        if not ours and not p.parent.is_dir():
            raise ConfigError(f"{key}: {str(p)!r} does not exist and neither does its parent; create it first")
        try:
            p.mkdir(mode=0o700, parents=True) if ours else p.mkdir()
        except OSError as exc:
            raise ConfigError(f"{key}: cannot create {str(p)!r} ({exc.strerror}); pick a writable directory") from exc
    if not p.is_dir():
        raise ConfigError(f"{key}: {str(p)!r} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {str(p)!r} is not writable; fix its permissions or pick another path")
    return p


class DiskTier(LedgerTier):
    """The ledger is one for all ranks: slot s of every rank's file holds that rank's shard of
    the same block. Only a record intact in every rank's file is recovered on open."""

    def __init__(self, path: str | Path, layout: DiskLayout, cache_policy: str | PolicyRef | CachePolicy = "lru",
                 enable_events: bool = False, key: str = "tiers[1].path", retry_after_s: float = 60.0,
                 namespace: KVNamespace | None = None, size_note: str = "") -> None:
        """``size_note``: why the tier has its size (``50% of the free space``), for the line
        that says a file found at another size was resized."""
        super().__init__(layout.num_slots, cache_policy, DiskLoadStoreSpec, layout.block_tokens, enable_events,
                         retry_after_s)
        self.layout = layout
        directory = prepare_tier_dir(path, key)
        warn_if_shared_with_others(directory, f"{key}: the disk tier directory")
        self.paths = [tier_file(directory, layout.for_rank(r)) for r in range(layout.world_size)]
        self.path = self.paths[0]
        self.num_recovered = 0
        self.size_note = size_note
        self._fds: list[int] = []
        try:
            for p in self.paths:
                self._fds.append(self._open_locked(p))
            self._open_or_create()
        except BaseException:
            self.close()
            raise
        self._warn_if_larger_than_free_space(directory)
        if namespace is not None:
            self._announce(directory, namespace)

    def _warn_if_larger_than_free_space(self, directory: Path) -> None:
        """The files are sparse: creating them succeeds whatever their size, and a tier larger
        than the file system's free space fails only later, with ENOSPC, when it fills."""
        try:
            held = sum(os.fstat(fd).st_blocks * 512 for fd in self._fds)
            free = shutil.disk_usage(directory).free + held
        except OSError:
            return
        needed = self.layout.file_bytes * len(self._fds)
        if needed > free:
            logger.warning("kvoffload: disk tier %s: %s", self.path,
                           capacity_past_free_space(format_bytes(needed), format_bytes(free)))

    def _announce(self, directory: Path, namespace: KVNamespace) -> None:
        """One line naming the namespace opened, and one saying why caches of other namespaces
        in the directory are not reused; the components are kept beside the file for that."""
        logger.info("kvoffload: disk tier %s: %s; recovered %d blocks", self.path, namespace.describe(),
                    self.num_recovered)
        stale = []
        for digest, other in read_namespace_files(directory).items():
            if digest == self.layout.digest:
                continue
            theirs = other.pop(NAMESPACE_KEY, "")
            other.pop(LABEL_KEY, None)
            why = "the secret differs" if theirs == namespace.digest else \
                f"{', '.join(namespace.differences(other)) or 'format'} differ"
            stale.append(f"{theirs or digest} ({why})")
        if stale:
            logger.warning("kvoffload: disk tier %s: not reusing the cache of namespace %s in the same directory: "
                           "what changes the KV changed; those files stay until removed", self.path, "; ".join(stale))
        sidecar = namespace_file(directory, self.layout.digest)
        entries = namespace.as_dict() | {NAMESPACE_KEY: namespace.digest}
        if namespace.label:
            entries[LABEL_KEY] = namespace.label
        try:
            replace_file(sidecar, json.dumps(entries, indent=1, sort_keys=True).encode())
        except OSError as exc:
            logger.warning("kvoffload: disk tier %s: cannot write %s (%s); it only explains namespace changes",
                           self.path, sidecar, exc.strerror)

    @staticmethod
    def _open_locked(path: Path) -> int:
        """The tier file, created if missing and locked; the lock is taken before the file is
        written and kept only while ``path`` still names the file locked (a ``cache clear``
        between open and lock removed that one: open again). A symlink, FIFO or hard-linked
        file planted at ``path`` is refused: the tier would truncate whatever it points at."""
        for _ in range(8):
            try:
                fd = open_file(path, os.O_RDWR | os.O_CREAT, mode=0o644)
            except ForeignEntryError as exc:
                raise DiskTierError(f"disk tier {path} is {exc.strerror}: someone else writes {path.parent}; "
                                    "remove it and keep the directory to this user") from None
            except OSError as exc:
                raise DiskTierError(f"disk tier {path}: cannot open ({exc.strerror}); fix its permissions or "
                                    "pick another path") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise DiskTierError(f"disk tier {path} is in use by {lock_holder(path)}; stop that engine (a "
                                        "killed server can leave its engine processes running), or give each "
                                        "engine its own path") from None
                raise DiskTierError(f"disk tier {path}: cannot lock ({exc.strerror})") from None
            if same_file(fd, path):
                return fd
            os.close(fd)
        raise DiskTierError(f"disk tier {path}: removed each time it was opened; stop whatever deletes it")

    def _open_or_create(self) -> None:
        layouts = [self.layout.for_rank(r) for r in range(self.layout.world_size)]
        headers = [os.pread(fd, HEADER_BYTES, 0) for fd in self._fds]
        if all(lay.matches(h) for lay, h in zip(layouts, headers)):
            self._recover(layouts)
            return
        found = [parse_file_header(h) for h in headers]
        olds = [f[0] for f in found if f is not None]
        if len(olds) == len(layouts) and all(replace(o, num_slots=lay.num_slots) == lay
                                             for o, lay in zip(olds, layouts)):
            self._resize(layouts, olds)
            return
        if any(any(h) for h in headers):
            logger.warning("disk tier %s was written with another layout or version; starting it empty", self.path)
        for fd, lay, p in zip(self._fds, layouts, self.paths):
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, lay.file_header(), 0)
                os.ftruncate(fd, lay.file_bytes)
            except OSError as exc:
                raise DiskTierError(
                    f"disk tier {p}: cannot create its {lay.file_bytes} byte file ({exc.strerror}); "
                    "free space, lower the tier's capacity or pick another path"
                ) from None

    def _resize(self, layouts: list[DiskLayout], olds: list[DiskLayout]) -> None:
        """The same tier at another size (a share of a free space that moved, or a new
        capacity): the records in slots that still exist are kept, those past the new end
        dropped, and the line says so. The files are read once, at their old size, before
        they are cut or grown."""
        new, old = layouts[0].num_slots, olds[0].num_slots
        dropped = self._recover(olds)
        for fd, lay, p in zip(self._fds, layouts, self.paths):
            try:  # shrinking: cut first; a crash between leaves the old header over a shorter file
                if new < old:
                    os.ftruncate(fd, lay.file_bytes)
                os.pwrite(fd, lay.file_header(), 0)
                if new > old:
                    os.ftruncate(fd, lay.file_bytes)
            except OSError as exc:
                raise DiskTierError(f"disk tier {p}: cannot resize it to {lay.file_bytes} bytes ({exc.strerror}); "
                                    "free space, lower the tier's capacity or pick another path") from None
        why = f" ({self.size_note})" if self.size_note else ""
        logger.warning("kvoffload: disk tier %s: capacity %s -> %s%s: %s blocks kept, %s dropped (slots past the new "
                       "end)", self.path, format_bytes(olds[0].file_bytes * len(olds)),
                       format_bytes(layouts[0].file_bytes * len(layouts)), why,
                       f"{self.num_recovered:,}", f"{dropped:,}")

    def _recover(self, layouts: list[DiskLayout]) -> int:
        """Restore every record intact in every rank's file, in slots the tier has now; the files
        are read as ``layouts`` say they are (their old size, when resizing). Returns the intact
        records of the first rank past the tier's end (dropped)."""
        per_rank: list[dict[int, object]] = []
        past_end = 0
        for fd, lay in zip(self._fds, layouts):
            records: dict[int, object] = {}
            for slot, key, intact in scan_records(fd, lay):
                if slot >= self.layout.num_slots:
                    if not per_rank and key is not None and intact:
                        past_end += 1  # the first rank's, as the resize line counts them
                elif key is None or not intact:
                    self.num_corrupt += 1
                else:
                    records[slot] = key
            per_rank.append(records)
        first_slot: dict[object, int] = {}
        for slot, key in sorted(per_rank[0].items()):
            if all(other.get(slot) == key for other in per_rank[1:]):
                first_slot.setdefault(key, slot)  # a hash stored twice keeps one slot
        self.index.restore(list(first_slot.items()))
        self.num_recovered = len(first_slot)
        if self.num_corrupt:
            logger.warning("disk tier %s: dropped %d torn or truncated blocks on open", self.path, self.num_corrupt)
        return past_end

    def describe(self) -> str:
        return f"disk tier {self.path}"

    def report(self) -> TierReport:
        return replace(super().report(), blocks_recovered=self.num_recovered)

    def close(self) -> None:
        if self._fds:
            self._say_if_unlinked(self._fds[0])
        for fd in self._fds:
            os.close(fd)  # releases the lock
        self._fds = []

    def _say_if_unlinked(self, fd: int) -> None:
        """Another process deleted or replaced the file while this one used it: the tokens stay
        right (every read checks its record), but what the tier held is gone with this process,
        and the next run starts cold; said once, here, rather than not at all."""
        ours = os.fstat(fd)
        try:
            there = os.stat(self.path)
        except OSError:
            there = None
        if there is None or (there.st_dev, there.st_ino) != (ours.st_dev, ours.st_ino):
            logger.warning("kvoffload: disk tier %s was %s by another process while this one used it: the %d blocks it "
                           "held are lost at exit and the next run starts cold; give each process its own directory",
                           self.path, "deleted" if there is None else "replaced", self.num_used_blocks)
