"""EngineKVInfo: the engine's KV facts an offload backend needs, in a leaf module so the
engine can describe its cache without importing the backend."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.namespace import KVNamespace


@dataclass(frozen=True, slots=True)
class EngineKVInfo:
    """What the backend must know about the engine's KV cache, and nothing more."""

    block_size: int  # tokens per engine block
    block_bytes: int  # bytes of one engine block across all layers (K and V)
    num_device_blocks: int = 0  # engine blocks in the device KV cache
    layout_digest: str = ""  # identifies model + layout, so persistent tiers never misread
    #: Ranks that each hold a shard of every block (tensor x pipeline parallel), and this
    #: process's rank among them (workers; the scheduler side serves all ranks). ``block_bytes``
    #: is one rank's share.
    world_size: int = 1
    rank: int = 0
    #: What ``layout_digest`` was computed from, for the tiers' start-up lines and for saying
    #: why a persistent cache was not reused (None: an engine that names only a digest).
    namespace: KVNamespace | None = None
