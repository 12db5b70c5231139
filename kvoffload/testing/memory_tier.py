"""A tier kind for tests and the chaos harness: a third tier (medium REMOTE) held in this
process's memory, built only from the TierKind plugin surface, so a chain [cpu, disk, remote]
runs end to end. Not for serving: its bytes live in the worker and die with it."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvoffload.offload.abstract import BlockHash, Medium
from kvoffload.offload.ledger_tier import LedgerTier
from kvoffload.offload.mediums import KeyedLoadStoreSpec
from kvoffload.registry import PolicyRef
from kvoffload.tiers.base import TierKind
from kvoffload.transfer.result import BlockTransferError
from kvoffload.transfer.tier_io import TierIO

#: The test-only medium: registered here, named nowhere outside kvoffload.testing.
REMOTE = Medium.register("REMOTE")


class RemoteLoadStoreSpec(KeyedLoadStoreSpec):
    """Slots of the in-memory test tier (a stand-in for a store other replicas read)."""

    __slots__ = ()

    @staticmethod
    def medium() -> Medium:
        return REMOTE


class MemoryTier(LedgerTier):
    def __init__(self, num_blocks: int, cache_policy: str | PolicyRef = "lru", enable_events: bool = False,
                 block_size: int = 0, retry_after_s: float = 60.0) -> None:
        super().__init__(num_blocks, cache_policy, RemoteLoadStoreSpec, block_size, enable_events, retry_after_s)


class MemoryIO(TierIO):
    name = "memory tier"

    def __init__(self) -> None:
        self.records: dict[int, tuple[object, bytes]] = {}
        self.lock = threading.Lock()
        self.writes = self.reads = 0

    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        with self.lock:
            for data, slot, key in zip(blocks, slots, keys):
                self.records[slot] = (key, bytes(data))
            self.writes += len(slots)

    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        with self.lock:
            bad = [s for s, k in zip(slots, keys) if s not in self.records or self.records[s][0] != k]
            if bad:
                raise BlockTransferError(f"memory tier: slots {bad} hold other blocks", bad)
            for slot, view in zip(slots, out):
                view[:] = self.records[slot][1]
            self.reads += len(slots)


class MemoryKind(TierKind):
    medium = REMOTE
    spec_type = RemoteLoadStoreSpec
    #: The IO the last worker built, so a test can look inside.
    last_io: MemoryIO | None = None

    def build_manager(self) -> MemoryTier:
        t = self.ctx.tier
        return MemoryTier(self.ctx.num_slots, t.cache_policy, self.ctx.events, self.ctx.block_tokens)

    def build_io(self) -> MemoryIO:
        io = MemoryIO()
        MemoryKind.last_io = io
        return io
