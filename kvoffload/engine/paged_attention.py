"""Paged KV writes through a slot mapping, and attention that reads history via block tables.

Cache layout per layer: ``(2, num_blocks, block_size, num_kv_heads, head_dim)`` — K then V.
A token at position p of a request lives in slot ``block_table[p // bs] * bs + p % bs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; negative = padding, not written
    query_start_loc: list[int]  # [num_reqs + 1] offsets of each request's tokens
    seq_lens: list[int]  # [num_reqs] context length after this step's tokens
    block_tables: torch.Tensor  # [num_reqs, max_blocks] int64
    block_size: int


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's K/V ([T, kv_heads, head_dim]) into their slots."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key[valid])
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value[valid])


def gather_context(
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seq_len`` K and V rows of one request, in position order."""
    num_blocks = -(-seq_len // block_size)
    ids = block_table[:num_blocks]
    k = kv_cache[0].index_select(0, ids).flatten(0, 1)[:seq_len]
    v = kv_cache[1].index_select(0, ids).flatten(0, 1)[:seq_len]
    return k, v


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of each request's new queries over its whole paged context.

    query: [T, num_heads, head_dim] → [T, num_heads, head_dim].
    """
    out = torch.empty_like(query)
    num_heads = query.shape[1]
    for r, seq_len in enumerate(meta.seq_lens):
        start, end = meta.query_start_loc[r], meta.query_start_loc[r + 1]
        if end == start:
            continue
        k, v = gather_context(kv_cache, meta.block_tables[r], seq_len, meta.block_size)
        groups = num_heads // k.shape[1]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        n = end - start
        q_pos = torch.arange(seq_len - n, seq_len, device=query.device).unsqueeze(1)
        mask = torch.arange(seq_len, device=query.device).unsqueeze(0) <= q_pos
        q = query[start:end].transpose(0, 1)
        attn = F.scaled_dot_product_attention(q, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale)
        out[start:end] = attn.transpose(0, 1)
    return out
