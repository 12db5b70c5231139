"""The device KV cache checked against the memory it would take, before it is allocated.

``kvoffload run --num-gpu-blocks 2000000`` asked the host for 32.8 GB at start: unlimited, the
kernel's OOM killer took the process at 18.8 GB with no word of why. A cache larger than what
the device has free is refused in one line, as the disk tier refuses a file past the free space.
"""

from __future__ import annotations

import torch

from kvoffload.engine.kv_groups import kv_cache_layout
from kvoffload.engine.model_config import ModelConfig
from kvoffload.host_memory import available_memory_bytes


def device_cache_bytes(model_config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of the engine's KV tensors: K and V of every block of every tensor slot."""
    per_token = model_config.num_key_value_heads * model_config.head_dim * torch.finfo(dtype).bits // 8
    return kv_cache_layout(model_config).num_tensors * 2 * num_blocks * block_size * per_token


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on ``device`` (None where it cannot be told)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_memory_bytes() if device.type == "cpu" else None


def check_device_cache(model_config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> None:
    need = device_cache_bytes(model_config, num_blocks, block_size, dtype)
    free = available_bytes(device)
    if free is not None and need > free:
        raise ValueError(f"the device KV cache of {num_blocks} blocks x {block_size} tokens needs {need / 2**30:.1f} "
                         f"GiB, more than the {free / 2**30:.1f} GiB {device} has free: lower --num-gpu-blocks "
                         "(or --block-size)")
