"""Whether a request can ever run on this engine: refused when it is added, with the number
that does not fit and the setting to change, rather than waiting forever in the queue."""

from __future__ import annotations

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.single_type_manager import cdiv


def check_fits(rid: str, num_prompt_tokens: int, params: SamplingParams, cfg: EngineConfig) -> None:
    """Raise ValueError if the prompt leaves no room to generate, if its KV (or its beams' KV,
    which advance together) can never fit the device cache, or if its samples can never run
    at once."""
    if num_prompt_tokens >= cfg.max_model_len:
        raise ValueError(
            f"request {rid!r}: prompt has {num_prompt_tokens} tokens, max_model_len={cfg.max_model_len} "
            "leaves no room to generate; shorten the prompt or raise max_model_len"
        )
    need = cdiv(min(num_prompt_tokens + params.max_tokens, cfg.max_model_len), cfg.block_size)
    if need > cfg.num_gpu_blocks - 1:
        raise ValueError(
            f"request {rid!r}: needs {need} KV blocks but num_gpu_blocks={cfg.num_gpu_blocks} "
            f"holds {cfg.num_gpu_blocks - 1}; raise num_gpu_blocks or lower max_tokens"
        )
    width = max(params.n, params.beam_width)
    if width > cfg.max_num_seqs:
        name = "n" if params.n > 1 else "beam_width"
        raise ValueError(f"request {rid!r}: {name}={width} sequences never run at once with max_num_seqs="
                         f"{cfg.max_num_seqs}; lower {name} or raise max_num_seqs")
    if params.beam_width:
        # Beams advance together: all of them (shared prompt, own outputs) must fit at once.
        prompt_blocks = num_prompt_tokens // cfg.block_size
        group = prompt_blocks + params.beam_width * (need - prompt_blocks)
        if group > cfg.num_gpu_blocks - 1:
            raise ValueError(
                f"request {rid!r}: beam_width={params.beam_width} needs {group} KV blocks at once but "
                f"num_gpu_blocks={cfg.num_gpu_blocks} holds {cfg.num_gpu_blocks - 1}; lower beam_width or "
                "max_tokens, or raise num_gpu_blocks"
            )
