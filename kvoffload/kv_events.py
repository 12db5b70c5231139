"""KV events in vLLM's schema (``vllm/distributed/kv_events.py``), field by field, for engines
and tools that do not import vLLM: the bundled engine's ``LLM.take_kv_events()`` returns these,
and the vLLM integration turns each into vLLM's own msgspec struct of the same name.

KV-aware routers (Dynamo, llm-d) index a replica's blocks by these events: a block's hash is the
engine's hash of that block (a 64-bit integer, as vLLM publishes its device blocks), chained to
its parent, with its token ids, so the router can tell which replica holds a prompt's prefix in
which medium. ``medium`` is a name routers place: ``CPU`` (host memory), ``DISK`` (this
machine's disk), ``SHARED`` (a store every replica reads: an fs directory, Mooncake).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

#: ``locality`` of a block in a medium this replica reads as its own.
LOCAL = "LOCAL"
#: What events carry for a block hash: a 64-bit integer (vLLM's default), or the hash's bytes
#: where vLLM is told to publish those (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).
ExternalBlockHash = int | bytes


def external_block_hash(block_hash: Hashable) -> int:
    """The 64-bit integer events carry for an engine block hash: the low 64 bits of its bytes
    read big-endian, as vLLM publishes its own (``maybe_convert_block_hash``); an integer hash
    is kept (to 64 bits)."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
    if isinstance(block_hash, int):
        return block_hash & ((1 << 64) - 1)
    raise TypeError(f"block hash {block_hash!r}: an engine block hash is bytes or an int")


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks that became readable in ``medium``: one event per offloaded block, with the engine
    hash of each engine block it spans (in order), the hash of the engine block before the
    first (None at a prompt's start), and the tokens of all of them."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    group_idx: int | None = None
    locality: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks no longer readable in ``medium`` (evicted, or a cache reset)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every block of the publisher is gone (vLLM's, for completeness: kvoffload's own reset
    removes exactly the blocks it announced, with ``BlockRemoved``, and leaves the device's)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared

__all__ = ["LOCAL", "AllBlocksCleared", "BlockRemoved", "BlockStored", "ExternalBlockHash", "KVEvent", "external_block_hash"]
