"""The bundled engine's KV facts for a connector: geometry, and the namespace of everything
that changes a block's bytes (weights, model config, dtype, hash algorithm)."""

from __future__ import annotations

import dataclasses

import torch

from kvoffload.config import weight_digest_dir
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.hashing import HASH_ALGORITHM, ROOT_BLOCK_HASH
from kvoffload.engine.kv_groups import kv_cache_layout
from kvoffload.engine.model_config import ModelConfig
from kvoffload.kv_info import EngineKVInfo
from kvoffload.namespace import KVNamespace, config_digest
from kvoffload.weight_digests import weights_fingerprint


def engine_kv_info(config: EngineConfig, model: ModelConfig) -> EngineKVInfo:
    """The KV geometry a connector needs: block size, bytes per block, and the namespace of
    everything that changes a block's bytes (weights, model config, dtype, hash)."""
    itemsize = torch.empty(0, dtype=getattr(torch, config.dtype)).element_size()
    layout = kv_cache_layout(model)
    block_bytes = layout.num_tensors * 2 * config.block_size * model.num_key_value_heads * model.head_dim * itemsize
    namespace = engine_namespace(config, model, block_bytes)
    return EngineKVInfo(block_size=config.block_size, block_bytes=block_bytes,
                        num_device_blocks=config.num_gpu_blocks, layout_digest=namespace.digest, namespace=namespace,
                        group_windows=layout.windows)


def engine_namespace(config: EngineConfig, model: ModelConfig, block_bytes: int) -> KVNamespace:
    if model.checkpoint_dir:
        weights = "checkpoint:" + weights_fingerprint(model.checkpoint_dir, weight_digest_dir())
    else:  # built-in models: random weights drawn from the seed
        weights = f"random:{config.model}:seed={config.seed}"
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "checkpoint_dir"}
    return KVNamespace.of({
        "weights": weights,
        "model": config_digest(fields),
        "dtype": config.dtype,
        "kv_dtype": config.dtype,
        "geometry": f"{config.block_size}t/{block_bytes}b",
        "hash": f"{HASH_ALGORITHM}:{ROOT_BLOCK_HASH.hex()}",
    }, label=model.checkpoint_dir or config.model)
