"""The local-disk tier kind: one preallocated record file per rank, recovered on restart."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvoffload.auth import RecordTagger
from kvoffload.config import ConfigError, TierConfig, default_cache_dir, format_bytes
from kvoffload.offload.mediums import DISK, DiskLoadStoreSpec
from kvoffload.tiers.base import TierContext, TierKind
from kvoffload.tiers.disk.format import DiskLayout
from kvoffload.tiers.disk.io import DiskIO
from kvoffload.tiers.disk.tier import DiskOffloadingManager, prepare_tier_dir, tier_file

#: Backpressure default: a store to the disk is allowed 10 ms plus this per MiB (10 MB/s), queueing
#: included. A local disk writes into the page cache at GB/s; one this late is saturated, and
#: every store queued on it holds the host slot its victim leaves (measured: a disk at 2 MB/s
#: held the host tier's slots, so finished requests held their device blocks, and eight chats
#: ran 2.7x slower than without offload). Skipped stores leave the blocks in host memory.
DEFAULT_MAX_STORE_MS_PER_MIB = 100.0


class DiskTier(TierKind):
    medium = DISK
    spec_type = DiskLoadStoreSpec
    option_keys = frozenset({"max_store_ms_per_mib"})

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
    def check_environment(cls, tier: TierConfig, key: str) -> list[str]:
        """The directory usable and writable (the per-user cache directory counts as creatable),
        and the tier within the free space, counting what its files already hold."""
        assert tier.path is not None
        p = Path(tier.path)
        try:
            target = p if p.exists() else p.parent
            if p == default_cache_dir():  # ours: created with its parents at start-up
                target = next(a for a in (p, *p.parents) if a.exists())
            if not target.is_dir():
                raise ConfigError(f"{key}.path: {tier.path!r} does not exist and neither does its parent; "
                                  "create it first")
            if not os.access(target, os.W_OK | os.X_OK):
                raise ConfigError(f"{key}.path: {str(target)!r} is not writable; fix its permissions or pick "
                                  "another path")
            held = sum(f.stat().st_blocks * 512 for f in p.glob("*.kvdata")) if p.exists() else 0
            free = shutil.disk_usage(target).free + held
        except OSError as exc:
            raise ConfigError(f"{key}.path: {tier.path[:200]!r} is not usable ({exc.strerror}); pick another "
                              "path") from None
        if tier.capacity_bytes > free:
            raise ConfigError(f"{key}.capacity: {format_bytes(tier.capacity_bytes)} exceeds the free space at "
                              f"{tier.path} ({format_bytes(free)}); lower the capacity or free space")
        return []

    def __init__(self, ctx: TierContext) -> None:
        super().__init__(ctx)
        secret = ctx.auth.load_secret()
        self._secret = secret
        self._digest = ctx.tier_digest(RecordTagger(secret).key_id) if ctx.layout_digest else "unnamed"

    def store_latency_bound_s(self) -> float | None:
        options = self.ctx.tier.options
        return (DEFAULT_MAX_STORE_MS_PER_MIB if options is None else float(options)) / 1000.0

    def layout(self) -> DiskLayout:
        c = self.ctx
        return DiskLayout(digest=self._digest, block_bytes=c.block_bytes, block_tokens=c.block_tokens,
                          num_slots=c.num_slots, world_size=c.world_size)

    def _path(self) -> str:
        path = self.ctx.tier.path
        assert path is not None, "config validation requires a disk tier's path"
        return path

    def build_manager(self) -> DiskOffloadingManager:
        t = self.ctx.tier
        return DiskOffloadingManager(self._path(), self.layout(), t.cache_policy, self.ctx.events,
                                     key=f"{self.ctx.key}.path", namespace=self.ctx.namespace)

    def build_io(self) -> DiskIO:
        layout = self.layout().for_rank(self.ctx.rank)  # each rank reads and writes only its own file
        tagger = RecordTagger(self._secret, layout.file_digest, self.ctx.auth.algorithm)
        return DiskIO(layout, tier_file(prepare_tier_dir(self._path(), f"{self.ctx.key}.path"), layout), tagger)
