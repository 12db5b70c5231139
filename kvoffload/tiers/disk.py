"""The local-disk tier kind: one preallocated record file per rank, recovered on restart."""

from __future__ import annotations

from kvoffload.auth import RecordTagger
from kvoffload.offload.abstract import Medium
from kvoffload.offload.disk_format import DiskLayout
from kvoffload.offload.disk_manager import DiskOffloadingManager, prepare_tier_dir, tier_file
from kvoffload.offload.mediums import DiskLoadStoreSpec
from kvoffload.tiers.base import TierContext, TierKind
from kvoffload.transfer.disk_io import DiskIO


class DiskTier(TierKind):
    medium = Medium.DISK
    spec_type = DiskLoadStoreSpec

    def __init__(self, ctx: TierContext) -> None:
        super().__init__(ctx)
        secret = ctx.auth.load_secret()
        self._secret = secret
        self._digest = ctx.tier_digest(RecordTagger(secret).key_id) if ctx.layout_digest else "unnamed"

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
        return DiskOffloadingManager(self._path(), self.layout(), t.eviction_policy, self.ctx.events,
                                     key=f"{self.ctx.key}.path", namespace=self.ctx.namespace)

    def build_io(self) -> DiskIO:
        layout = self.layout().for_rank(self.ctx.rank)  # each rank reads and writes only its own file
        tagger = RecordTagger(self._secret, layout.file_digest, self.ctx.auth.algorithm)
        return DiskIO(layout, tier_file(prepare_tier_dir(self._path(), f"{self.ctx.key}.path"), layout), tagger)
