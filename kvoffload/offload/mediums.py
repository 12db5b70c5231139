"""Concrete LoadStoreSpecs: which medium a list of slot ids refers to."""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, Medium, SlotIds

#: The disk tier's medium, registered here beside its spec because ``DiskLoadStoreSpec`` is
#: public API of this package (SPEC section 6); every other kind registers its medium beside
#: its own kind (``tiers/fs/spec.py``, ``tiers/mooncake/spec.py``).
DISK = Medium.register("DISK")


class GPULoadStoreSpec(LoadStoreSpec):
    """Device KV-cache block ids (the engine's blocks, not offloaded-block slots)."""

    __slots__ = ()

    @staticmethod
    def medium() -> Medium:
        return Medium.GPU


class CPULoadStoreSpec(LoadStoreSpec):
    __slots__ = ()

    @staticmethod
    def medium() -> Medium:
        return Medium.CPU


class KeyedLoadStoreSpec(LoadStoreSpec):
    """Slots of a secondary tier, with the block hashes their records are keyed by: a write
    stores each key with its block, a read checks it (a misplaced record is never served)."""

    __slots__ = ("block_hashes",)

    def __init__(self, block_ids: Sequence[int] | SlotIds, block_hashes: list[BlockHash] | None = None) -> None:
        super().__init__(block_ids)
        self.block_hashes = block_hashes

    @classmethod
    def for_blocks(cls, block_ids: Sequence[int] | SlotIds, block_hashes: list[BlockHash]) -> LoadStoreSpec:
        return cls(block_ids, list(block_hashes))


class DiskLoadStoreSpec(KeyedLoadStoreSpec):
    """Slots of the local-disk tier's record file."""

    __slots__ = ()

    @staticmethod
    def medium() -> Medium:
        return DISK
