"""The fs tier's medium and the spec naming its blocks (the scheduler and worker halves share it)."""

from __future__ import annotations

from kvoffload.offload.abstract import Medium
from kvoffload.offload.mediums import KeyedLoadStoreSpec

FS = Medium.register("FS", event_name="SHARED", shared=True)


class FsLoadStoreSpec(KeyedLoadStoreSpec):
    """Blocks of a shared fs tier: the hashes address them (as file names); the slot ids only
    pair each block with its hash in the scheduler's ledger."""

    __slots__ = ()

    @staticmethod
    def medium() -> Medium:
        return FS
