"""The local-disk tier kind: one preallocated record file per rank, recovered on restart."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvoffload.auth import RecordTagger
from kvoffload.config import ConfigError, TierConfig, default_cache_dir, format_bytes
from kvoffload.offload.mediums import DISK, DiskLoadStoreSpec
from kvoffload.tiers.base import TierContext, TierKind
from kvoffload.tiers.disk.format import HEADER_BYTES, RECORD_HEADER, DiskLayout, parse_file_header
from kvoffload.tiers.disk.io import DiskIO
from kvoffload.tiers.disk.tier import DiskTier, capacity_past_free_space, prepare_tier_dir, tier_file

logger = logging.getLogger(__name__)

#: Backpressure default: a store to the disk is allowed 10 ms plus this per MiB (10 MB/s), queueing
#: included. A local disk writes into the page cache at GB/s; one this late is saturated, and
#: every store queued on it holds the host slot its victim leaves (measured: a disk at 2 MB/s
#: held the host tier's slots, so finished requests held their device blocks, and eight chats
#: ran 2.7x slower than without offload). Skipped stores leave the blocks in host memory.
DEFAULT_MAX_STORE_MS_PER_MIB = 100.0


#: A tier file already there keeps its size across starts while the share of the free space
#: stays within this factor of it (the free space moves a little; a new size empties the tier).
SHARE_TOLERANCE = 0.1
_MIB = 1 << 20


class DiskKind(TierKind):
    medium = DISK
    spec_type = DiskLoadStoreSpec
    option_keys = frozenset({"max_store_ms_per_mib"})
    relative_capacity = True

    @classmethod
    def storage_overhead(cls) -> tuple[int, int]:
        return RECORD_HEADER, HEADER_BYTES  # each record's header, each rank's file header

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], key: str) -> float:
        """The tier's only own key, ``max_store_ms_per_mib`` (its backpressure bound)."""
        value = raw.get("max_store_ms_per_mib", DEFAULT_MAX_STORE_MS_PER_MIB)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 60_000:
            raise ConfigError(f"{key}.max_store_ms_per_mib: {value!r}; give a number above 0 and at most 60000, "
                              f"e.g. {DEFAULT_MAX_STORE_MS_PER_MIB:g}")
        return float(value)

    @classmethod
    def default_path(cls) -> str:
        return str(default_cache_dir())

    @classmethod
    def share_of_free_space(cls, path: str, share: float, key: str) -> int:
        """``share`` of the free space at ``path`` plus what the tier files there already hold
        (so a restart, or a tier filling up, does not shrink it), in whole MiB."""
        free = _free_for(Path(path), f"{key[: -len('.capacity')]}.path")
        chosen = int(share * free) // _MIB * _MIB
        if chosen < _MIB:
            raise ConfigError(f"{key}: {100 * share:g}% of the {format_bytes(free)} free at {path} is less than "
                              "1 MiB; free space, give a larger share or pick another path")
        return chosen

    @classmethod
    def check_environment(cls, tier: TierConfig, key: str) -> list[str]:
        """The directory usable and writable (the per-user cache directory counts as creatable),
        and the tier within the free space, counting what its files already hold."""
        assert tier.path is not None
        p = Path(tier.path)
        target = p if p.exists() else p.parent
        if p == default_cache_dir():  # ours: created with its parents at start-up
            target = _existing(p)
        try:
            if not target.is_dir():
                raise ConfigError(f"{key}.path: {tier.path!r} does not exist and neither does its parent; "
                                  "create it first")
            if not os.access(target, os.W_OK | os.X_OK):
                raise ConfigError(f"{key}.path: {str(target)!r} is not writable; fix its permissions or pick "
                                  "another path")
        except OSError as exc:
            raise ConfigError(f"{key}.path: {tier.path[:200]!r} is not usable ({exc.strerror}); pick another "
                              "path") from None
        free = _free_for(p, f"{key}.path")
        if tier.capacity_bytes > free:  # the engine starts and warns the same (the file is sparse)
            return [f"{key}.capacity: {capacity_past_free_space(format_bytes(tier.capacity_bytes), format_bytes(free))}"]
        return []

    def __init__(self, ctx: TierContext) -> None:
        super().__init__(ctx)
        secret = ctx.auth.load_secret()
        self._secret = secret
        self._digest = ctx.tier_digest(RecordTagger(secret).key_id) if ctx.layout_digest else "unnamed"
        self._layout: DiskLayout | None = None
        #: Why the tier has its size, for the line a resized file gets ("" for a fixed capacity).
        self.size_note = ""

    def store_latency_bound_s(self) -> float | None:
        options = self.ctx.tier.options
        return (DEFAULT_MAX_STORE_MS_PER_MIB if options is None else float(options)) / 1000.0

    def layout(self) -> DiskLayout:
        """Chosen once per process (the manager and the I/O side must agree on it)."""
        if self._layout is None:
            self._layout = self._choose_layout()
        return self._layout

    def _choose_layout(self) -> DiskLayout:
        c = self.ctx
        layout = DiskLayout(digest=self._digest, block_bytes=c.block_bytes, block_tokens=c.block_tokens,
                            num_slots=c.num_slots, world_size=c.world_size)
        share = c.tier.capacity_share
        if share is None:
            return layout
        # The config sized the share before the tier's name was known, counting every tier file in
        # the directory; here only this tier's own files count as space it may reuse (another
        # model's files are never freed by this tier).
        path = Path(self._path())
        own = 0
        for r in range(layout.world_size):
            with contextlib.suppress(OSError):  # not there yet
                own += os.stat(tier_file(path, layout.for_rank(r))).st_blocks * 512
        try:
            free = shutil.disk_usage(_existing(path)).free
        except OSError:
            free = c.tier.capacity_bytes
        chosen = int(share * (free + own)) // _MIB * _MIB
        slots = max(1, c.num_slots * chosen // max(1, c.tier.capacity_bytes))
        # A share of the free space moves a little from start to start; a tier file of nearly
        # that size keeps its size (a new size keeps the records that fit it).
        kept = _slots_on_disk(tier_file(path, layout.for_rank(0)), layout)
        if kept is not None and abs(kept - slots) <= SHARE_TOLERANCE * slots:
            slots = kept
        elif kept is not None:
            self.size_note = (f"{100 * share:g}% of the free space, which {'fell' if slots < kept else 'grew'}")
        return DiskLayout(layout.digest, layout.block_bytes, layout.block_tokens, slots, 0, layout.world_size)

    def _path(self) -> str:
        path = self.ctx.tier.path
        assert path is not None, "config validation requires a disk tier's path"
        return path

    def build_manager(self) -> DiskTier:
        t = self.ctx.tier
        if t.capacity_share is not None:
            logger.info("kvoffload: disk tier at %s: capacity %s (%g%% of the free space there)", t.path,
                        format_bytes(self.layout().file_bytes * self.ctx.world_size), 100 * t.capacity_share)
        layout = self.layout()
        return DiskTier(self._path(), layout, t.cache_policy, self.ctx.events, key=f"{self.ctx.key}.path",
                        namespace=self.ctx.namespace, size_note=self.size_note)

    def build_io(self) -> DiskIO:
        layout = self.layout().for_rank(self.ctx.rank)  # each rank reads and writes only its own file
        tagger = RecordTagger(self._secret, layout.file_digest, self.ctx.auth.algorithm)
        return DiskIO(layout, tier_file(prepare_tier_dir(self._path(), f"{self.ctx.key}.path"), layout), tagger)


def _existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists (the directory is made at start-up)."""
    return next((a for a in (path, *path.parents) if a.exists()), path)


def _free_for(path: Path, key: str) -> int:
    """The free space where ``path`` is, plus what the tier files there already hold."""
    try:
        held = sum(f.stat().st_blocks * 512 for f in path.glob("*.kvdata")) if path.is_dir() else 0
        return shutil.disk_usage(_existing(path)).free + held
    except OSError as exc:
        raise ConfigError(f"{key}: {str(path)[:200]!r} is not usable ({exc.strerror}); pick another path") from None


def _slots_on_disk(path: Path, layout: DiskLayout) -> int | None:
    """The slot count of the tier file at ``path`` if it is one of this layout but for its size."""
    try:
        with open(path, "rb") as f:
            found = parse_file_header(f.read(HEADER_BYTES))
    except OSError:
        return None
    if found is None:
        return None
    other = found[0]
    same = (other.digest, other.block_bytes, other.block_tokens, other.world_size) == (
        layout.digest, layout.block_bytes, layout.block_tokens, layout.world_size)
    return other.num_slots if same else None

