"""The Mooncake tier's medium and the spec naming its blocks (the scheduler and worker halves
share it)."""

from __future__ import annotations

from kvoffload.offload.abstract import Medium
from kvoffload.offload.mediums import KeyedLoadStoreSpec

MOONCAKE = Medium.register("MOONCAKE", event_name="SHARED", shared=True)


class MooncakeLoadStoreSpec(KeyedLoadStoreSpec):
    """Blocks of the shared Mooncake Store tier: the hashes address them (as store keys); the
    slot ids only pair each block with its hash in the scheduler's ledger."""

    __slots__ = ()

    @staticmethod
    def medium() -> Medium:
        return MOONCAKE
