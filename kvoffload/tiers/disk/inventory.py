"""What disk tiers left in a directory, for ``kvoffload cache``: list, verify, clear.

Works on the files, not through an engine, so it also explains caches that no running engine
opens any more (another model, another layout, a rotated secret). A file an engine holds (its
lock) is shown as in use and never removed: clearing takes the lock first, as an engine would.
"""

from __future__ import annotations

import fcntl
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kvoffload.auth import RecordTagger
from kvoffload.safe_files import ForeignEntryError, open_file
from kvoffload.tiers.disk.format import HEADER_BYTES, RECORD_HEADER, DiskLayout, parse_file_header, scan_records
from kvoffload.tiers.disk.io import record_problem
from kvoffload.tiers.disk.tier import (
    NAMESPACE_GLOB,
    NAMESPACE_KEY,
    find_lock_holder,
    read_namespace_files,
    same_file,
    sidecar_digest,
)

TIER_GLOB = "kvoffload-*.kvdata"


@dataclass(slots=True)
class CacheFile:
    """One tier file: its layout, what it holds and who holds it."""

    path: Path
    layout: DiskLayout | None  # None: another format or version (never read by an engine)
    file_digest: str = ""
    records: int = 0
    torn: int = 0  # record headers cut short or torn (dropped when an engine opens the file)
    disk_bytes: int = 0  # allocated on disk (the file is sparse)
    last_used: float = 0.0  # last write (mtime)
    holder: str | None = None  # the engine process holding the file, if any
    namespace: dict[str, str] = field(default_factory=dict)  # components, from the namespace file

    @property
    def namespace_digest(self) -> str | None:
        """The namespace's digest (the file is named by the tier digest: the namespace folded
        with the secret's id); None when its namespace file is missing."""
        return self.namespace.get(NAMESPACE_KEY)

    @property
    def capacity_bytes(self) -> int:
        return self.layout.num_slots * self.layout.block_bytes if self.layout else 0

    def as_dict(self) -> dict[str, object]:
        lay = self.layout
        return {"path": str(self.path), "digest": lay.digest if lay else None, "rank": lay.rank if lay else None,
                "world_size": lay.world_size if lay else None, "block_bytes": lay.block_bytes if lay else None,
                "block_tokens": lay.block_tokens if lay else None, "slots": lay.num_slots if lay else None,
                "namespace_digest": self.namespace_digest, "records": self.records, "torn": self.torn,
                "disk_bytes": self.disk_bytes,
                "capacity_bytes": self.capacity_bytes, "last_used": self.last_used, "in_use_by": self.holder,
                "namespace": self.namespace}


@dataclass(slots=True)
class VerifyResult:
    path: Path
    intact: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # reason -> records


def list_files(directory: Path) -> tuple[list[CacheFile], list[str]]:
    """Every tier file in ``directory``, with its namespace where its namespace file names it;
    and a line for each entry skipped (a directory, link or FIFO under a tier file's name, or
    a file that cannot be read), naming it and the fix."""
    namespaces = read_namespace_files(directory)
    out: list[CacheFile] = []
    skipped: list[str] = []
    for path in sorted(directory.glob(TIER_GLOB)):
        try:
            fd = open_file(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except ForeignEntryError as exc:
            skipped.append(f"{path}: {exc.strerror}, not a tier file; remove it (nothing reads it)")
            continue
        except OSError as exc:
            skipped.append(f"{path}: cannot be read ({exc.strerror}); fix its permissions or remove it")
            continue
        try:
            st = os.fstat(fd)
            parsed = parse_file_header(os.pread(fd, HEADER_BYTES, 0))
            entry = CacheFile(path, parsed[0] if parsed else None, parsed[1] if parsed else "",
                              disk_bytes=st.st_blocks * 512, last_used=st.st_mtime, holder=find_lock_holder(path))
            if entry.layout is not None:
                for _, key, intact in scan_records(fd, entry.layout):
                    if key is not None and intact:
                        entry.records += 1
                    else:
                        entry.torn += 1
                entry.namespace = namespaces.get(entry.layout.digest, {})
        finally:
            os.close(fd)
        out.append(entry)
    return out, skipped


def verify_file(entry: CacheFile, tagger: RecordTagger | None = None) -> VerifyResult:
    """Read every record and check its tag, as a load would. ``tagger``: the tier's secret
    (``auth:``), for files written with one; default: the plain checksum."""
    result = VerifyResult(entry.path)
    lay = entry.layout
    if lay is None:
        result.failed["format"] += 1
        return result
    check = tagger or RecordTagger(None, entry.file_digest)
    fd = open_file(entry.path, os.O_RDONLY)
    try:
        for slot, key, intact in scan_records(fd, lay):
            if key is None or not intact:
                result.failed["format"] += 1
                continue
            raw = os.pread(fd, lay.record_bytes, lay.offset(slot))
            reason = record_problem(raw[:RECORD_HEADER], raw[RECORD_HEADER:], len(raw) == lay.record_bytes, key, check)
            if reason is None:
                result.intact += 1
            else:
                result.failed[reason] += 1
    finally:
        os.close(fd)
    return result


def clear_files(entries: list[CacheFile]) -> tuple[list[Path], list[str]]:
    """Remove the files (and namespace files no tier file uses any more); returns (removed,
    refusals). A file is removed only under its lock, and only if its name still names the file
    locked, so never from under an engine."""
    removed: list[Path] = []
    refused: list[str] = []
    for entry in entries:
        try:
            fd = open_file(entry.path, os.O_RDONLY)
        except (FileNotFoundError, ForeignEntryError):
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                refused.append(f"{entry.path}: in use by {find_lock_holder(entry.path) or 'another process'}; "
                               "stop that engine first")
                continue
            if same_file(fd, entry.path):
                entry.path.unlink()
                removed.append(entry.path)
        finally:
            os.close(fd)
    for directory in {e.path.parent for e in entries}:
        for side in orphan_namespace_files(directory):
            side.unlink(missing_ok=True)
            removed.append(side)
    return removed, refused


def orphan_namespace_files(directory: Path, leaving: set[Path] | None = None) -> list[Path]:
    """Namespace files whose tier files are all gone (or in ``leaving``, about to go)."""
    live = {p.name.split("-")[1] for p in directory.glob(TIER_GLOB) if p not in (leaving or set())}
    return [side for side in sorted(directory.glob(NAMESPACE_GLOB)) if sidecar_digest(side) not in live]

