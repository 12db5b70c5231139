"""A Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU) over a paged KV cache, on the skeleton in
``layers.py``.

Weights are seeded random by default, or loaded from a transformers Llama checkpoint with
the same parameter names, so greedy outputs can be checked against ``transformers`` itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvoffload.engine.layers import PagedDecoderLM, RMSNorm, RotaryEmbedding
from kvoffload.engine.model_config import ModelConfig
from kvoffload.engine.paged_attention import AttentionMetadata, paged_attention, write_kv


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        q, k = rope(q, k, positions)
        write_kv(kv_cache, k, v, meta.slot_mapping)
        out = paged_attention(q, kv_cache, meta, self.scale, window=None)
        return self.o_proj(out.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(PagedDecoderLM[DecoderLayer]):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, [DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)],
                         RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    def attend(self, i: int, layer: DecoderLayer, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        return h + layer.self_attn(layer.input_layernorm(h), positions, self.rope, kv_cache, meta)

    def feed_forward(self, layer: DecoderLayer, h: torch.Tensor) -> torch.Tensor:
        return h + layer.mlp(layer.post_attention_layernorm(h))
