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
    #: One entry per KV-cache group (block table): the sliding window in tokens, or None for
    #: full attention. A hybrid model has several; ``block_bytes`` is one block of any group.
    group_windows: tuple[int | None, ...] = (None,)

    def __post_init__(self) -> None:
        if not self.group_windows:
            raise ValueError("EngineKVInfo.group_windows: give one entry per KV-cache group, (None,) for one "
                             "full-attention group")
        bad = [w for w in self.group_windows if w is not None and w < 1]
        if bad:
            raise ValueError(f"EngineKVInfo.group_windows: window {bad[0]} must be >= 1 (None: full attention)")

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)
