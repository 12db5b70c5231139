"""Gemma 3 (text) over the paged KV cache: sliding-window and full-attention layers mixed.

What differs from Llama, as transformers' ``Gemma3ForCausalLM`` computes it: embeddings scaled
by sqrt(hidden), RMSNorm scaling by (1 + weight) in float32, QK-norm before RoPE, a RoPE base
per layer type (local for sliding layers, global for full ones), four norms per layer (around
attention and around the MLP), a tanh-GELU MLP, the attention scale from
``query_pre_attn_scalar``, and optional soft-capping of the logits. Parameter names
match the checkpoint's, so its safetensors load as they are. The decoder skeleton is
``layers.PagedDecoderLM``, shared with Llama.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvoffload.engine.layers import PagedDecoderLM, RotaryEmbedding
from kvoffload.engine.model_config import ModelConfig
from kvoffload.engine.paged_attention import AttentionMetadata, paged_attention, write_kv


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        self.window = cfg.layer_window(layer)
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        q, k = rope(q, k, positions)
        write_kv(kv_cache, k, v, meta.slot_mapping)
        out = paged_attention(q, kv_cache, meta, self.scale, window=self.window)
        return self.o_proj(out.reshape(t, -1))


class Gemma3MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.tanh = cfg.hidden_activation == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.gelu(self.gate_proj(x), approximate="tanh") if self.tanh else F.silu(self.gate_proj(x))
        return self.down_proj(gate * self.up_proj(x))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Gemma3Attention(cfg, layer)
        self.mlp = Gemma3MLP(cfg)
        eps = cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)


class Gemma3ForCausalLM(PagedDecoderLM[Gemma3DecoderLayer]):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, [Gemma3DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)],
                         GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.ropes = nn.ModuleList()
        self._rope_of: list[int] = []

    def build_ropes(self, device: torch.device) -> None:
        """One rotary embedding per layer type (local base for sliding layers, global for full)."""
        cfg = self.config
        full = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor).to(device)
        local = RotaryEmbedding(cfg.head_dim, cfg.rope_local_theta, cfg.rope_local_scaling_factor).to(device)
        self.ropes = nn.ModuleList([full, local])
        self._rope_of = [0 if cfg.layer_window(i) is None else 1 for i in range(cfg.num_hidden_layers)]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        return h * torch.tensor(self.config.hidden_size**0.5, dtype=h.dtype)

    def attend(self, i: int, layer: Gemma3DecoderLayer, h: torch.Tensor, positions: torch.Tensor,
               kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        rope = self.ropes[self._rope_of[i]]
        return h + layer.post_attention_layernorm(layer.self_attn(layer.input_layernorm(h), positions, rope,
                                                                  kv_cache, meta))

    def feed_forward(self, layer: Gemma3DecoderLayer, h: torch.Tensor) -> torch.Tensor:
        return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
