"""Concrete LoadStoreSpecs: which medium a list of slot ids refers to."""

from __future__ import annotations

from kvoffload.offload.abstract import LoadStoreSpec


class GPULoadStoreSpec(LoadStoreSpec):
    """Device KV-cache block ids (the engine's blocks, not offloaded-block slots)."""

    __slots__ = ()

    @staticmethod
    def medium() -> str:
        return "GPU"


class CPULoadStoreSpec(LoadStoreSpec):
    __slots__ = ()

    @staticmethod
    def medium() -> str:
        return "CPU"


class DiskLoadStoreSpec(LoadStoreSpec):
    __slots__ = ()

    @staticmethod
    def medium() -> str:
        return "DISK"
