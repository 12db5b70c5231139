"""Records returned by the model runner and by the LLM facade."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvoffload.connector.base import KVConnectorOutput


@dataclass(slots=True)
class ModelRunnerOutput:
    req_ids: list[str]
    #: One list per request: the sampled token, or empty for a partial (chunked) prefill.
    sampled_token_ids: list[list[int]]
    #: Logits of the sampled positions, kept only when the runner is asked to record them.
    logits: dict[str, torch.Tensor] = field(default_factory=dict)
    kv_connector_output: KVConnectorOutput | None = None
    #: Beam requests: top candidates (token, logprob) at the sampled position.
    beam_candidates: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    #: Requests that read a block a synchronous load failed to fill: the tokens whose KV is
    #: still good (they recompute from there; nothing was sampled for them).
    rolled_back: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    num_cached_tokens: int
    ttft_s: float | None
    #: n > 1: every sample's tokens (samples[0] == token_ids); beam search: the beams, best first.
    samples: list[list[int]] = field(default_factory=list)
    #: Beam search: length-normalised log-probability of each returned beam.
    scores: list[float] = field(default_factory=list)
