"""DiskOffloadingManager: the block ledger of a local-disk tier that survives restarts.

Scheduler-side and tensor-free like the CPU ledger (it is one, over disk slots), plus the
file: created and preallocated on first use, locked against a second concurrent owner, and
scanned on open so every intact record is served again.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from kvoffload.offload.cpu_manager import CPUOffloadingManager
from kvoffload.offload.disk_format import DiskLayout, scan_records
from kvoffload.offload.mediums import DiskLoadStoreSpec
from kvoffload.offload.policy import CachePolicy

logger = logging.getLogger(__name__)


class DiskTierError(OSError):
    pass


def tier_file(path: str | Path, layout: DiskLayout) -> Path:
    return Path(path) / f"kvoffload-{layout.digest}-{layout.block_bytes}.kvdata"


def prepare_tier_dir(path: str | Path, key: str = "tiers[1].path") -> Path:
    """Create the leaf directory if its parent exists; fail clearly otherwise."""
    from kvoffload.config import ConfigError

    p = Path(path)
    if not p.exists():
        if not p.parent.is_dir():
            raise ConfigError(f"{key}: {str(p)!r} does not exist and neither does its parent; create it first")
        try:
            p.mkdir()
        except OSError as exc:
            raise ConfigError(f"{key}: cannot create {str(p)!r} ({exc.strerror}); pick a writable directory") from exc
    if not p.is_dir():
        raise ConfigError(f"{key}: {str(p)!r} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {str(p)!r} is not writable; fix its permissions or pick another path")
    return p


class DiskOffloadingManager(CPUOffloadingManager):
    spec_type = DiskLoadStoreSpec

    def __init__(self, path: str | Path, layout: DiskLayout, cache_policy: str | CachePolicy = "lru",
                 enable_events: bool = False) -> None:
        super().__init__(layout.num_slots, cache_policy, enable_events, block_size=layout.block_tokens)
        self.layout = layout
        self.path = tier_file(prepare_tier_dir(path), layout)
        self.num_corrupt = 0
        self.num_recovered = 0
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DiskTierError(f"disk tier {self.path} is in use by another process") from exc
            raise
        self._open_or_create()

    def _open_or_create(self) -> None:
        header = os.pread(self._fd, len(self.layout.file_header()), 0)
        if self.layout.matches(header):
            first_slot: dict = {}
            for slot, key, intact in scan_records(self._fd, self.layout):
                if key is None or not intact:
                    self.num_corrupt += 1
                else:
                    first_slot.setdefault(key, slot)  # a hash stored twice keeps one slot
            self.restore(list(first_slot.items()))
            self.num_recovered = len(first_slot)
            if self.num_corrupt:
                logger.warning("disk tier %s: dropped %d torn or truncated blocks on open", self.path, self.num_corrupt)
            return
        if any(header):
            logger.warning("disk tier %s was written with another layout or version; starting it empty", self.path)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, self.layout.file_header(), 0)
        os.ftruncate(self._fd, self.layout.file_bytes)

    def drop_corrupt(self, slots: list[int]) -> int:
        """Drop the blocks at these slots (a read found their data checksum wrong)."""
        hashes = [h for h in (self.hash_at(s) for s in slots) if h is not None]
        n = len(self.drop(hashes))
        self.num_corrupt += n
        return n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1
