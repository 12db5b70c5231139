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


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    num_cached_tokens: int
    ttft_s: float | None
