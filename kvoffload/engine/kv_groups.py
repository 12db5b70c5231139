"""KV-cache groups: which layers share a block table (vLLM's hybrid allocator, in small).

Layers of one attention type (full, or sliding with one window) are cut into groups of equal
size; every group gets its own block table from the one block pool. KV tensor j is shared by
the j-th layer of every group, so a block id holds exactly one group's K/V, over that group's
layers, and a block is one page whatever the mix: a full-attention-only model is one group of
all its layers (one tensor per layer, as before), Gemma 3's tiny 3 sliding + 1 full layers are
four groups of one layer over a single tensor. Full-attention groups come first.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from kvoffload.engine.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    #: The layers using this group's block table; layers[j] lives in KV tensor j.
    layers: tuple[int, ...]
    #: Tokens a query sees in these layers, itself included (None: full attention).
    sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    groups: tuple[KVCacheGroup, ...]
    #: KV tensors to allocate (the largest group's layer count).
    num_tensors: int
    #: Per layer: (group index, tensor index).
    placement: tuple[tuple[int, int], ...]

    @property
    def windows(self) -> tuple[int | None, ...]:
        return tuple(g.sliding_window for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1


def kv_cache_layout(cfg: ModelConfig) -> KVCacheLayout:
    by_window: dict[int | None, list[int]] = {}
    for layer in range(cfg.num_hidden_layers):
        by_window.setdefault(cfg.layer_window(layer), []).append(layer)
    size = 0
    for layers in by_window.values():
        size = gcd(size, len(layers))
    groups: list[KVCacheGroup] = []
    for window in sorted(by_window, key=lambda w: (w is not None, w or 0)):
        layers = by_window[window]
        groups += [KVCacheGroup(tuple(layers[i : i + size]), window) for i in range(0, len(layers), size)]
    placement: list[tuple[int, int]] = [(0, 0)] * cfg.num_hidden_layers
    for g, group in enumerate(groups):
        for j, layer in enumerate(group.layers):
            placement[layer] = (g, j)
    return KVCacheLayout(tuple(groups), size, tuple(placement))
