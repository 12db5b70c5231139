"""The ``medium: fs`` tier kind: a cache directory shared by every engine process pointed at it,
on one host or many (NFS, Lustre, a Kubernetes volume), with no coordinator; or several
directories (``paths:``, one per drive) with blocks spread over them by key.

It is a shared store made of files (FsStore), so it reuses what every shared tier has: lookups
asked once per request on a background thread (StoreLookups: a slow file system costs misses,
never a stalled step), keyed and checksummed records (StoreIO, the same records as Mooncake's),
the remote ledger (FsTier, which reports the whole directory's fill) and the chain's
fences, promotion and metrics. Written through by default: a process shares every block it
computes, not only its CPU victims.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvoffload.auth import RecordTagger
from kvoffload.config import TierConfig, expand_path, format_bytes
from kvoffload.errors import ConfigError
from kvoffload.tiers.base import TierContext, TierKind
from kvoffload.tiers.fs.directory import FsDirectory, may_create_parents, missing_mount
from kvoffload.tiers.fs.options import OPTION_KEYS, FsOptions, parse_options
from kvoffload.tiers.fs.spec import FS, FsLoadStoreSpec
from kvoffload.tiers.fs.store import FsStore
from kvoffload.tiers.fs.tier import FsTier
from kvoffload.tiers.store.io import StoreIO
from kvoffload.tiers.store.keys import StoreKeys
from kvoffload.tiers.store.record import HEADER_BYTES

logger = logging.getLogger(__name__)

#: Records of a worker's StoreIO staging arena: only their headers are used (files are read
#: into and written from the blocks' own memory), so the rest is never touched.
STAGING_RECORDS = 64


def tier_roots(tier: TierConfig, key: str) -> list[str]:
    """The directories of an fs tier (``paths``, else ``path``), resolved (symlinks, ``..``, a
    trailing slash), so one directory is never opened twice, with half the capacity each."""
    options: FsOptions = tier.options
    if options.paths and tier.path is not None:
        raise ConfigError(f"{key}: both path and paths given; use path for one directory or paths for several")
    roots = [expand_path(p, f"{key}.paths") for p in options.paths] or ([tier.path] if tier.path else [])
    if not roots:
        raise ConfigError(f"{key}.path: required for medium fs; give the shared cache directory, e.g. "
                          "/mnt/shared/kvcache (or paths: [...] for one directory per drive)")
    resolved = [os.path.realpath(r) for r in roots]
    for i, a in enumerate(resolved):
        for j in range(i):
            b = resolved[j]
            if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
                how = "are one directory" if a == b else "lie one inside the other"
                raise ConfigError(f"{key}.paths: {roots[j]!r} and {roots[i]!r} {how} ({b} and {a}); list each "
                                  "directory once, none inside another")
    return resolved


class FsKind(TierKind):
    medium = FS
    spec_type = FsLoadStoreSpec
    option_keys = OPTION_KEYS
    last_in_chain = True
    default_write_through = True

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], key: str) -> FsOptions:
        return parse_options(raw, key)

    @classmethod
    def validate(cls, tier: TierConfig, key: str) -> None:
        tier_roots(tier, key)
        if tier.eviction_policy != "lru":
            raise ConfigError(f"{key}.eviction_policy: {tier.eviction_policy!r}; the fs tier evicts least recently "
                              "used records (file times every process sharing the directory sees); remove the key")

    @classmethod
    def check_environment(cls, tier: TierConfig, key: str) -> list[str]:
        """Each directory creatable and writable, and its share of the capacity within its free space."""
        roots = tier_roots(tier, key)
        share = tier.capacity_bytes // len(roots)
        warnings = []
        for root in roots:
            p = Path(root)
            if not p.is_dir() and not p.parent.is_dir() and not may_create_parents(p):
                raise ConfigError(missing_mount(f"{key}.path", p))
            target = next((a for a in (p, *p.parents) if a.exists()), p)
            if not os.access(target, os.W_OK | os.X_OK):
                raise ConfigError(f"{key}.path: {root[:200]!r} is not writable; fix its permissions or pick another "
                                  "directory")
            free = shutil.disk_usage(target).free
            if share > free:
                warnings.append(f"{key}: {format_bytes(share)} of capacity on {root}, which has {format_bytes(free)} "
                                "free (shared directories may be filled by other processes too)")
        return warnings

    @property
    def options(self) -> FsOptions:
        options: FsOptions = self.ctx.tier.options
        return options

    def __init__(self, ctx: TierContext) -> None:
        super().__init__(ctx)
        self._tagger = RecordTagger(ctx.auth.load_secret(), "", ctx.auth.algorithm)  # the key carries the namespace

    def store_latency_bound_s(self) -> float | None:
        return self.options.max_store_ms_per_mib / 1000.0

    def keys(self) -> StoreKeys:
        return self.ctx.store_keys(self._tagger.key_id)

    def store(self) -> FsStore:
        """The directories, opened: one record is this rank's share of a block and its header."""
        c = self.ctx
        roots = tier_roots(c.tier, c.key)
        share = c.tier.capacity_bytes // len(roots)
        return FsStore([FsDirectory(Path(r), share, HEADER_BYTES + c.block_bytes, f"{c.key}.path") for r in roots],
                       self.options.io_threads)

    def build_manager(self) -> FsTier:
        store = self.store()
        # Temporaries of processes killed mid-write, and counts they left high: reclaimed once,
        # off the critical path (evictions reclaim them too, bucket by bucket).
        store.start_sweep()
        logger.info("kvoffload: %s (fs): %s, %s over %d bucket(s) per directory%s", self.ctx.key, store.name,
                    format_bytes(self.ctx.tier.capacity_bytes), len(store.directories[0].buckets),
                    f", records authenticated (secret id {self._tagger.key_id})" if self._tagger.authenticated else "")
        return FsTier(store, self.keys(), HEADER_BYTES + self.ctx.block_bytes, self.ctx.num_slots,
                             self.options.retry_after_s, self.ctx.events, self.ctx.block_tokens)

    def build_io(self) -> StoreIO:
        record = HEADER_BYTES + self.ctx.block_bytes
        return StoreIO(self.store(), self.keys(), self.ctx.rank, self.ctx.block_bytes, STAGING_RECORDS * record,
                       self._tagger)
