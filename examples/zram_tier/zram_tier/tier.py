"""The scheduler half of the zram tier: its medium, its spec, and a ledger tier over its slots.

Its slots are this process's own, so it is a ``LedgerTier``: the slot table (which block in
which slot, the eviction order) is kvoffload's; the tier only names its medium and spec.
"""

from __future__ import annotations

from kvoffload.offload.abstract import Medium
from kvoffload.offload.ledger_tier import LedgerTier
from kvoffload.offload.mediums import KeyedLoadStoreSpec
from kvoffload.registry import PolicyRef

#: Registered once, when this module is imported: the set of media is open.
ZRAM = Medium.register("ZRAM")


class ZramLoadStoreSpec(KeyedLoadStoreSpec):
    """Slots of the zram tier, with the hashes their records are keyed by (a read checks them)."""

    __slots__ = ()

    @staticmethod
    def medium() -> Medium:
        return ZRAM


class ZramTier(LedgerTier):
    def __init__(self, num_blocks: int, cache_policy: str | PolicyRef = "lru", enable_events: bool = False,
                 block_size: int = 0) -> None:
        # retry_after_s=None: host memory cannot fail a copy, so the tier keeps no I/O health.
        super().__init__(num_blocks, cache_policy, ZramLoadStoreSpec, block_size, enable_events, retry_after_s=None)
