"""CPUTier: the host-memory tier, a LedgerTier over CPU slots.

``CPUOffloadingManager(num_blocks, cache_policy, enable_events)``, vLLM's name for it, is the
public constructor (SPEC §6): the same class. Its slot table is the native one for the
policies the C ledger implements, where it is built, and the Python one for any other policy
(``native`` forces either).
"""

from __future__ import annotations

from kvoffload.offload.abstract import BlockNotReadyError
from kvoffload.offload.ledger_tier import MAX_QUEUED_EVENTS, LedgerTier
from kvoffload.offload.mediums import CPULoadStoreSpec
from kvoffload.offload.policy import CachePolicy
from kvoffload.registry import PolicyRef

__all__ = ["MAX_QUEUED_EVENTS", "BlockNotReadyError", "CPUOffloadingManager", "CPUTier"]


class CPUTier(LedgerTier):
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
        super().__init__(num_blocks, cache_policy, CPULoadStoreSpec, block_size, enable_events, native=native)


#: vLLM's name for the host tier's scheduler half (``vllm.v1.kv_offload.cpu.manager``), where
#: its users look for it.
CPUOffloadingManager = CPUTier
