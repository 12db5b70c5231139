"""Paged KV writes through a slot mapping, and attention that reads history via block tables.

Cache layout per layer: ``(2, num_blocks, block_size, num_kv_heads, head_dim)`` — K then V.
A token at position p of a request lives in slot ``block_table[p // bs] * bs + p % bs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: torch >= 2.5 attends grouped-query heads in place (``enable_gqa``); older ones get each KV
#: head repeated for its query heads first, a copy of the whole context per layer and request
#: (a tenth of a bundled decode step's time in a profile; such steps ran 5% faster without it).
_SDPA_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


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
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, block_size: int, first_block: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V rows of one request from block ``first_block`` up to position ``seq_len``, in
    position order."""
    num_blocks = -(-seq_len // block_size)
    ids = block_table[first_block:num_blocks]
    end = seq_len - first_block * block_size
    k = kv_cache[0].index_select(0, ids).flatten(0, 1)[:end]
    v = kv_cache[1].index_select(0, ids).flatten(0, 1)[:end]
    return k, v


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    window: int | None = None) -> torch.Tensor:
    """Causal attention of each request's new queries over its paged context: all of it, or
    with ``window`` the last ``window`` positions up to each query's own (its block table may
    hold the null block further left: those rows are masked, never read as context).

    query: [T, num_heads, head_dim] → [T, num_heads, head_dim].
    """
    out = torch.empty_like(query)
    num_heads = query.shape[1]
    for r, seq_len in enumerate(meta.seq_lens):
        start, end = meta.query_start_loc[r], meta.query_start_loc[r + 1]
        if end == start:
            continue
        n = end - start
        first_block = max(0, seq_len - n - window + 1) // meta.block_size if window is not None else 0
        k, v = gather_context(kv_cache, meta.block_tables[r], seq_len, meta.block_size, first_block)
        groups = num_heads // k.shape[1]
        gqa = groups > 1 and _SDPA_GQA
        if groups > 1 and not gqa:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        q_pos = torch.arange(seq_len - n, seq_len, device=query.device).unsqueeze(1)
        k_pos = torch.arange(first_block * meta.block_size, seq_len, device=query.device).unsqueeze(0)
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        q = query[start:end].transpose(0, 1)
        attn = F.scaled_dot_product_attention(q, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale,
                                              **({"enable_gqa": True} if gqa else {}))
        out[start:end] = attn.transpose(0, 1)
    return out
