"""Concrete LoadStoreSpecs: which medium a list of slot ids refers to."""

from __future__ import annotations

from kvoffload.offload.abstract import LoadStoreSpec, Medium


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


class DiskLoadStoreSpec(LoadStoreSpec):
    """Disk slots; a write also carries the block hashes its records are keyed by."""

    __slots__ = ("block_hashes",)

    def __init__(self, block_ids, block_hashes: list | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(block_ids)
        self.block_hashes = block_hashes

    @staticmethod
    def medium() -> Medium:
        return Medium.DISK
