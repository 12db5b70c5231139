"""CPUOffloadingManager: the host-memory tier, a LedgerTier over CPU slots.

``CPUOffloadingManager(num_blocks, cache_policy, enable_events)`` is the public constructor
(SPEC §6); the ledger behind it comes from ``make_ledger``: the native one for "lru", "arc" and
"arc_classic" where it is built, the Python one for any other policy.
"""

from __future__ import annotations

from kvoffload.offload.ledger_factory import make_ledger
from kvoffload.offload.ledger_tier import MAX_QUEUED_EVENTS, LedgerTier
from kvoffload.offload.mediums import CPULoadStoreSpec
from kvoffload.offload.policy import CachePolicy
from kvoffload.offload.slot_ledger import BlockNotReadyError
from kvoffload.registry import PolicyRef

__all__ = ["MAX_QUEUED_EVENTS", "BlockNotReadyError", "CPUOffloadingManager"]


class CPUOffloadingManager(LedgerTier):
    def __init__(
        self,
        num_blocks: int,
        cache_policy: str | PolicyRef | CachePolicy = "lru",
        enable_events: bool = False,
        block_size: int = 0,
        native: bool | None = None,
    ) -> None:
        """``native``: None = the native ledger when it is built and runs ``cache_policy``,
        False = the Python ledger, True = the native one or NativeLedgerUnavailableError."""
        ledger = make_ledger(cache_policy, num_blocks, native, name=CPULoadStoreSpec.medium())
        super().__init__(ledger, CPULoadStoreSpec, block_size, enable_events)
