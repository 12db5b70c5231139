"""TierKind: a kind of secondary tier as a plugin, named by ``tiers[i].medium`` in the config.

A kind says what its medium is and builds its two halves: the scheduler-side ledger (a
SecondaryTierManager, tensor-free, one for all ranks) and the worker-side block I/O (a TierIO,
this rank's share). The spec chains the tiers and gives every kind the same handler, fences
and demotion path, so a new tier is these three things and nothing else. Kinds are found
through ``kvoffload.registry.TIER_KINDS``: built-ins, the ``kvoffload.tiers`` entry points, or
``package.module:Class``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from kvoffload.config import TierConfig
from kvoffload.offload.abstract import Medium
from kvoffload.offload.mediums import KeyedLoadStoreSpec
from kvoffload.offload.secondary import SecondaryTierManager
from kvoffload.transfer.tier_io import TierIO


@dataclass(frozen=True, slots=True)
class TierContext:
    """What a tier kind needs to build its halves."""

    tier: TierConfig
    key: str  # "tiers[1]", for messages
    num_slots: int  # offloaded blocks the tier holds
    block_bytes: int  # one rank's share of an offloaded block
    block_tokens: int  # tokens per offloaded block
    layout_digest: str  # model + KV layout: persistent tiers never serve another model's bytes
    world_size: int  # ranks sharing each block (tensor x pipeline parallel)
    rank: int  # this worker's rank (the scheduler side serves all ranks)
    events: bool  # emit KV events for blocks entering and leaving the tier


class TierKind(ABC):
    medium: ClassVar[Medium]
    spec_type: ClassVar[type[KeyedLoadStoreSpec]]

    def __init__(self, ctx: TierContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def build_manager(self) -> SecondaryTierManager:
        """The scheduler-side ledger (built once, by the scheduler half)."""

    @abstractmethod
    def build_io(self) -> TierIO:
        """This rank's block I/O (built by each worker)."""
