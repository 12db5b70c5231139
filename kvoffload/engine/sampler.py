"""Greedy and seeded random sampling.

A random draw depends only on (request seed, output index), never on batch composition or
on how often the request was preempted, so runs with and without offload stay identical.
"""

from __future__ import annotations

import torch

from kvoffload.engine.sampling_params import SamplingParams


def sample_token(logits: torch.Tensor, params: SamplingParams, seed: int, output_index: int) -> int:
    if params.greedy:
        return int(torch.argmax(logits).item())
    scaled = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < params.top_p
        filtered = torch.zeros_like(probs)
        filtered[order[keep]] = sorted_probs[keep]
        probs = filtered / filtered.sum()
    gen = torch.Generator().manual_seed((seed * 1_000_003 + output_index) & 0x7FFF_FFFF_FFFF_FFFF)
    return int(torch.multinomial(probs, 1, generator=gen).item())
