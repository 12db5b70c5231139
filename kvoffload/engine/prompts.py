"""What the engine accepts as a prompt, checked before anything is enqueued.

A prompt is a string (the bundled byte tokenizer encodes it) or a sequence of integer token ids
inside the model's vocabulary; a request also needs SamplingParams and must fit the model
length (``check_fits``). Every refusal names the request and the value, and happens before the
first request of a batch is enqueued.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.request_fits import check_fits
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.tokenizer import ByteTokenizer

Prompt = str | Sequence[int]


def prompt_token_ids(prompt: Prompt, tokenizer: ByteTokenizer, vocab_size: int) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    try:
        token_ids = [operator.index(t) for t in prompt]
    except TypeError:
        raise TypeError(f"prompt {str(prompt)[:60]!r}: give a string or a list of integer token ids") from None
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    return token_ids


def checked_request(prompt: Prompt, params: SamplingParams, rid: str, tokenizer: ByteTokenizer, vocab_size: int,
                    config: EngineConfig) -> list[int]:
    """Everything that can be refused, before anything is enqueued; returns the token ids."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"request {rid!r}: sampling params {params!r} must be a SamplingParams")
    token_ids = prompt_token_ids(prompt, tokenizer, vocab_size)
    if not token_ids:
        raise ValueError(f"request {rid!r}: empty prompt; give at least one token")
    check_fits(rid, len(token_ids), params, config)
    return token_ids
