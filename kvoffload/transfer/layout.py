"""Canonical KV layout: every engine layout becomes block-major byte views.

An engine may hand over one tensor per layer shaped ``(2, num_blocks, ...)`` (K/V split
first), ``(num_blocks, 2, ...)`` (blocks first), or one cross-layer tensor. The block
dimension is found from shapes and strides: it is a dim of size ``num_blocks`` whose inner
dims are contiguous. Each combination of the outer (pre-block) indices becomes one uint8
view ``(num_blocks, row_bytes)`` whose row i holds block i's bytes for that slice. An
engine block's page is the concatenation of its rows across all views, in a fixed order, so
offloaded data is comparable (and checkable) across runs of the same model and layout.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch


class LayoutError(ValueError):
    """A KV-cache tensor whose block dimension cannot be determined."""


@dataclass(frozen=True, slots=True)
class CanonicalKVCache:
    views: tuple[torch.Tensor, ...]  # each (num_blocks, row_bytes) uint8, rows contiguous
    num_blocks: int
    #: The KV tensor each view is a slice of (tensors numbered in layer order), and the tensor
    #: of each layer an engine names: a layer-wise load copies, and waits for, one tensor at a
    #: time. Empty when the engine gave no layer names (one cross-layer tensor, a list).
    view_tensors: tuple[int, ...] = ()
    layer_tensors: Mapping[str, int] = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_tensors(self) -> int:
        return max(self.view_tensors, default=-1) + 1

    @property
    def row_bytes(self) -> tuple[int, ...]:
        return tuple(v.shape[1] for v in self.views)

    @property
    def row_offsets(self) -> tuple[int, ...]:
        """Where each view's row starts inside an engine block's page."""
        return tuple(itertools.accumulate(self.row_bytes[:-1], initial=0))

    @property
    def page_bytes(self) -> int:
        """Bytes of one engine block across every view (all layers, K and V)."""
        return sum(self.row_bytes)

    @property
    def device(self) -> torch.device:
        return self.views[0].device

    def layout_digest(self, extra: str = "") -> str:
        shape = ";".join(f"{v.shape[1]}" for v in self.views)
        return hashlib.sha256(f"{shape}|{self.num_blocks}|{extra}".encode()).hexdigest()[:16]


def _inner_contiguous(t: torch.Tensor, dim: int) -> bool:
    expected = 1
    for d in range(t.dim() - 1, dim, -1):
        if t.shape[d] != 1 and t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return t.stride(dim) >= expected or t.shape[dim] == 1


def find_block_dim(t: torch.Tensor, num_blocks: int) -> int:
    candidates = [d for d in range(t.dim()) if t.shape[d] == num_blocks and _inner_contiguous(t, d)]
    if not candidates:
        raise LayoutError(
            f"KV tensor of shape {tuple(t.shape)} and strides {t.stride()} has no dim of size "
            f"num_blocks={num_blocks} with contiguous inner dims"
        )
    if len(candidates) > 1 and num_blocks == 2:
        raise LayoutError(
            f"KV tensor of shape {tuple(t.shape)}: with num_blocks=2 the block dim cannot be told from the "
            "K/V axis; allocate at least 3 blocks"
        )
    # Several dims can match (num_blocks == block_size, say): the block dim is the outermost.
    return candidates[0]


def block_views(t: torch.Tensor, num_blocks: int) -> list[torch.Tensor]:
    dim = find_block_dim(t, num_blocks)
    outer = [range(t.shape[d]) for d in range(dim)]
    views = []
    for idx in itertools.product(*outer):
        sub = t
        for i in idx:
            sub = sub.select(0, i)  # drop leading outer dims one by one
        rows = sub.reshape(num_blocks, -1) if sub.dim() > 1 else sub.reshape(num_blocks, 1)
        views.append(rows.view(torch.uint8) if rows.dtype != torch.uint8 else rows)
    return views


#: The KV-cache tensors an engine registers: by layer name, in layer order, or one tensor.
KVCaches = Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor


def canonicalize(kv_caches: KVCaches, num_blocks: int) -> CanonicalKVCache:
    """Block-major byte views of every KV tensor (layers in the order given)."""
    if isinstance(kv_caches, torch.Tensor):
        tensors = [kv_caches]
    elif isinstance(kv_caches, Mapping):
        tensors = list(kv_caches.values())
    else:
        tensors = list(kv_caches)
    if not tensors:
        raise LayoutError("no KV-cache tensors were registered")
    # Layers of a hybrid model's KV-cache groups share tensors (vLLM registers each under every
    # layer using it): copy each storage once.
    names = list(kv_caches) if isinstance(kv_caches, Mapping) else []
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    unique: list[torch.Tensor] = []
    layer_tensors: dict[str, int] = {}
    for i, t in enumerate(tensors):
        key = (t.data_ptr(), tuple(t.shape))
        if key not in seen:
            seen[key] = len(unique)
            unique.append(t)
        if names:
            layer_tensors[names[i]] = seen[key]
    views: list[torch.Tensor] = []
    view_tensors: list[int] = []
    for i, t in enumerate(unique):
        block = block_views(t, num_blocks)
        views.extend(block)
        view_tensors += [i] * len(block)
    devices = {v.device for v in views}
    if len(devices) != 1:
        raise LayoutError(f"KV-cache tensors span several devices: {sorted(map(str, devices))}")
    return CanonicalKVCache(tuple(views), num_blocks, tuple(view_tensors), layer_tensors)
