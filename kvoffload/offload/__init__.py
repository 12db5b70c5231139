"""Scheduler-side offload backend: block ledgers, eviction policies, reuse filter, specs.

Tensor-free by design: nothing here imports torch or the engine.
"""

from kvoffload.offload.abstract import LoadStoreSpec, OffloadingEvent, OffloadingManager, PrepareStoreOutput
from kvoffload.offload.arc import ARCCachePolicy
from kvoffload.offload.block_status import BlockStatus, SlotArrays
from kvoffload.offload.cpu_tier import BlockNotReadyError, CPUOffloadingManager, CPUTier
from kvoffload.offload.lru import LRUCachePolicy
from kvoffload.offload.mediums import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvoffload.offload.policy import CachePolicy, LedgerCachePolicy
from kvoffload.offload.policy_registry import UnknownPolicyError, create_policy, get_policy_class, known_policies
from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager
from kvoffload.offload.spec import EngineKVInfo, OffloadingSpec, OffloadingSpecFactory

__all__ = [
    "ARCCachePolicy",
    "BlockNotReadyError",
    "BlockStatus",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CPUTier",
    "CachePolicy",
    "DiskLoadStoreSpec",
    "EngineKVInfo",
    "FilterReusedOffloadingManager",
    "GPULoadStoreSpec",
    "LRUCachePolicy",
    "LedgerCachePolicy",
    "LoadStoreSpec",
    "OffloadingEvent",
    "OffloadingManager",
    "OffloadingSpec",
    "OffloadingSpecFactory",
    "PrepareStoreOutput",
    "SlotArrays",
    "UnknownPolicyError",
    "create_policy",
    "get_policy_class",
    "known_policies",
]
