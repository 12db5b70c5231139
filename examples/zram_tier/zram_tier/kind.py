"""ZramKind: the plugin kvoffload finds by the entry point ``zram`` (or ``zram_tier.kind:ZramKind``
in ``tiers[i].medium``), which builds the tier's two halves."""

from __future__ import annotations

from kvoffload.tiers.base import TierKind
from zram_tier.io import ZramIO
from zram_tier.tier import ZRAM, ZramLoadStoreSpec, ZramTier


class ZramKind(TierKind):
    medium = ZRAM
    spec_type = ZramLoadStoreSpec

    def build_manager(self) -> ZramTier:
        ctx = self.ctx
        return ZramTier(ctx.num_slots, ctx.tier.cache_policy, ctx.events, ctx.block_tokens)

    def build_io(self) -> ZramIO:
        return ZramIO()
