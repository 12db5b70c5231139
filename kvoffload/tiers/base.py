"""TierKind: a kind of secondary tier as a plugin, named by ``tiers[i].medium`` in the config.

A kind says what its medium is and builds its two halves: the scheduler-side ledger (a
Tier, tensor-free, one for all ranks) and the worker-side block I/O (a TierIO,
this rank's share). The spec chains the tiers and gives every kind the same handler, fences
and demotion path, so a new tier is these three things and nothing else. Kinds are found
through ``kvoffload.registry.TIER_KINDS``: built-ins, the ``kvoffload.tiers`` entry points, or
``package.module:Class``.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvoffload.auth import AuthConfig
from kvoffload.config import TierConfig
from kvoffload.namespace import KVNamespace
from kvoffload.offload.abstract import Medium
from kvoffload.offload.mediums import KeyedLoadStoreSpec
from kvoffload.offload.tier import Tier
from kvoffload.tiers.store.keys import StoreKeys
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
    namespace: KVNamespace | None = None  # what layout_digest covers, for log lines
    auth: AuthConfig = field(default_factory=AuthConfig)  # authenticates the tier's records

    def tier_digest(self, key_id: str) -> str:
        """``layout_digest`` folded with the secret's id: replicas with another secret (a
        rotation under way) keep disjoint records instead of rejecting each other's."""
        if key_id == "none":
            return self.layout_digest
        return hashlib.sha256(f"{self.layout_digest}|auth={key_id}".encode()).hexdigest()[:16]

    def store_keys(self, key_id: str) -> StoreKeys:
        """The key names of this tier's blocks in a shared key-value store (``key_id``: the
        secret's id, as ``tier_digest`` folds it in)."""
        return StoreKeys.of(self.tier_digest(key_id), self.block_tokens, self.block_bytes, self.world_size)


class TierKind(ABC):
    medium: ClassVar[Medium]
    spec_type: ClassVar[type[KeyedLoadStoreSpec]]
    #: Config keys of this kind beyond name, medium, capacity, eviction_policy, path, write_through.
    option_keys: ClassVar[frozenset[str]] = frozenset()
    #: The tier must be the last of the chain (its victims leave the chain; nothing reads its slots).
    last_in_chain: ClassVar[bool] = False
    #: ``write_through`` when the config does not say.
    default_write_through: ClassVar[bool] = False
    #: The tier takes ``capacity: N%``, a share of the free space where it keeps its files.
    relative_capacity: ClassVar[bool] = False

    @classmethod
    def storage_overhead(cls) -> tuple[int, int]:
        """Bytes the kind keeps beside the KV: (per block, per rank), e.g. a file's record
        headers and its file header. ``capacity`` bounds the whole, so they take blocks away."""
        return 0, 0

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], key: str) -> Any:
        """Validate this kind's own keys (``raw`` holds only ``option_keys``); the result is
        ``TierConfig.options``. Raise ConfigError naming ``{key}.<option>``."""
        return None

    @classmethod
    def default_capacity(cls, options: Any) -> int | None:
        """``capacity`` when the config leaves it out; None: it is required."""
        return None

    @classmethod
    def share_of_free_space(cls, path: str, share: float, key: str) -> int:
        """``capacity: N%``: the size chosen at start-up (only kinds with ``relative_capacity``)."""
        raise NotImplementedError(f"{key}: this tier kind takes no share of the free space")

    @classmethod
    def default_path(cls) -> str | None:
        """A kind that keeps files takes ``path``; this is it when the config leaves it out.
        None: the kind takes no path."""
        return None

    @classmethod
    def validate(cls, tier: TierConfig, key: str) -> None:
        """Checks across this kind's keys and the generic ones (``path``), once the tier is
        parsed; raise ConfigError naming the key."""

    @classmethod
    def check_environment(cls, tier: TierConfig, key: str) -> list[str]:
        """What would fail at start-up on this machine (raise ConfigError) or looks risky
        (returned as warnings), for ``kvoffload config check``."""
        return []

    def __init__(self, ctx: TierContext) -> None:
        self.ctx = ctx

    def store_latency_bound_s(self) -> float | None:
        """Backpressure: a store to this tier is allowed 10 ms plus this many seconds per MiB,
        queueing included; while stores run later than that, new ones are skipped
        (``kvoffload.transfer.backpressure``; None: never skipped)."""
        return None

    @abstractmethod
    def build_manager(self) -> Tier:
        """The scheduler-side ledger (built once, by the scheduler half)."""

    @abstractmethod
    def build_io(self) -> TierIO:
        """This rank's block I/O (built by each worker)."""
