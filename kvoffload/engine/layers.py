"""What every bundled model is built from (nano-vllm's ``layers/`` beside its ``models/``): the
RMSNorm and rotary embedding both models use, and ``PagedDecoderLM``, the decoder skeleton they
share — embeddings, layers whose attention the connector's per-layer hooks surround (where a
layer's KV is loaded before it attends and stored after), a final norm and the LM head. A model
(``llama.py``, ``gemma3.py``) supplies its layers and how one layer attends and feeds forward.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

import torch
from torch import nn

from kvoffload.engine.model_config import ModelConfig
from kvoffload.engine.paged_attention import AttentionMetadata

#: Called around each layer's attention: (layer_index, kv_cache_of_layer).
LayerHook = Callable[[int, torch.Tensor], None]

#: A model's decoder layer type.
L = TypeVar("L", bound=nn.Module)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float, linear_factor: float = 1.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq / linear_factor, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos().to(q.dtype).unsqueeze(1)
        sin = emb.sin().to(q.dtype).unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Backbone(nn.Module, Generic[L]):
    """Parameter names as the checkpoints have them: ``model.embed_tokens``, ``model.layers.i``,
    ``model.norm``."""

    def __init__(self, cfg: ModelConfig, layers: Sequence[L], norm: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class PagedDecoderLM(nn.Module, ABC, Generic[L]):
    def __init__(self, cfg: ModelConfig, layers: Sequence[L], norm: nn.Module) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg, layers, norm)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    @abstractmethod
    def attend(self, i: int, layer: L, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        """Layer ``i``'s attention block: the residual stream after it (K/V written to the cache)."""

    @abstractmethod
    def feed_forward(self, layer: L, h: torch.Tensor) -> torch.Tensor:
        """The layer's MLP block: the residual stream after it."""

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[torch.Tensor],
        metas: Sequence[AttentionMetadata],
        before_attention: LayerHook | None = None,
        after_attention: LayerHook | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm; K/V of every token are cached.
        ``kv_caches[i]`` and ``metas[i]``: layer i's cache tensor and block tables."""
        h = self.embed(input_ids)
        layers: list[L] = list(self.model.layers)  # type: ignore[arg-type]
        for i, layer in enumerate(layers):
            if before_attention is not None:
                before_attention(i, kv_caches[i])
            h = self.attend(i, layer, h, positions, kv_caches[i], metas[i])
            if after_attention is not None:
                after_attention(i, kv_caches[i])
            h = self.feed_forward(layer, h)
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


class CausalLM(Protocol):
    """What the runner drives: Llama and Gemma 3 alike."""

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[torch.Tensor],
                 metas: Sequence[AttentionMetadata], before_attention: LayerHook | None = None,
                 after_attention: LayerHook | None = None) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...
