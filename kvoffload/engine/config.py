"""EngineConfig: every knob of the bundled engine, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = "tiny"
    block_size: int = 16
    num_gpu_blocks: int = 64
    max_model_len: int = 2048
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    enable_prefix_caching: bool = True
    seed: int = 0
    #: OffloadConfig, path to a YAML file, a dict, or None (no offload).
    kv_offload: Any = None
    #: A connector by registered name or ``module:Class``; set implicitly by ``kv_offload``.
    kv_connector: str | None = None
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    dtype: str = "float32"
    device: str = "cpu"
    #: Share of device blocks a waiting request may not take while running requests need room.
    watermark: float = 0.0
    #: On preemption: recompute (free the blocks) or swap (offload the KV, restore on resume).
    preemption_mode: str = "recompute"
    #: "auto": a checkpoint directory's weights; "dummy": seeded random weights of its shape
    #: (config.json only), as vLLM's ``--load-format dummy``: real compute, no download.
    load_format: str = "auto"

    def __post_init__(self) -> None:
        positive = ("block_size", "num_gpu_blocks", "max_model_len", "max_num_batched_tokens", "max_num_seqs")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.{name}={value!r}: must be a positive integer")
        if self.block_size > self.max_model_len:
            raise ValueError(f"EngineConfig.block_size={self.block_size}: a block holds more tokens than the longest "
                             f"request (max_model_len={self.max_model_len}); give a block of at most that, e.g. 16")
        if self.num_gpu_blocks < 2:
            raise ValueError(f"EngineConfig.num_gpu_blocks={self.num_gpu_blocks}: need >= 2 (block 0 is reserved)")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"EngineConfig.long_prefill_token_threshold={self.long_prefill_token_threshold}: must be >= 0 (0 = off)"
            )
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"EngineConfig.preemption_mode={self.preemption_mode!r}: use 'recompute' or 'swap'")
        if self.preemption_mode == "swap" and self.kv_offload is None and self.kv_connector is None:
            raise ValueError("EngineConfig.preemption_mode='swap' needs an offload tier: set kv_offload")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"EngineConfig.watermark={self.watermark}: must be in [0, 1), e.g. 0.01")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"EngineConfig.scheduling_policy={self.scheduling_policy!r}: use 'fcfs' or 'priority'")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"EngineConfig.load_format={self.load_format!r}: use 'auto' or 'dummy'")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"EngineConfig.dtype={self.dtype!r}: use float32, float16 or bfloat16")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"EngineConfig.max_num_batched_tokens={self.max_num_batched_tokens} < max_model_len="
                f"{self.max_model_len} needs enable_chunked_prefill=True, or raise the budget"
            )
