"""The namespace of a vLLM engine's KV blocks: everything in its config that changes them.

The model's path or hub id alone is not: new weights under the same directory, ``--revision``,
``--hf-overrides`` that change the KV (``rope_theta``, a sliding window), a quantization, a
KV-cache dtype or another prefix-hash algorithm all keep it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from kvoffload.config import weight_digest_dir
from kvoffload.namespace import KVNamespace, config_digest
from kvoffload.weight_digests import weights_fingerprint

logger = logging.getLogger("vllm.kvoffload")

#: hf_config keys that name files or tools, not what the model computes.
_VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset")


def _weights(model_config: Any, load_config: Any) -> str:
    load_format = str(getattr(load_config, "load_format", "auto"))
    if load_format == "dummy":  # random weights: the same on every start with the same seed
        return f"dummy:seed={getattr(model_config, 'seed', None)}"
    model = str(model_config.model)
    revision = getattr(model_config, "revision", None)
    fingerprint = weights_fingerprint(model, weight_digest_dir())
    if not fingerprint:
        fingerprint = weights_fingerprint(_cached_snapshot(model, revision), weight_digest_dir())
    if fingerprint:
        return f"files:{fingerprint}"
    logger.warning("kvoffload: the weights of %r could not be fingerprinted (not a local directory nor in the "
                   "Hugging Face cache); the offload namespace names them by id and revision %r only: pin a "
                   "revision so new weights under this name are not served old KV", model, revision)
    return f"id:{model}@{revision}"


def _cached_snapshot(model: str, revision: str | None) -> str:
    """The local snapshot directory of a hub model vLLM downloaded ("" if none)."""
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a hub id, not cached, no huggingface_hub: no snapshot
        return ""


def vllm_namespace(vllm_config: Any, kv_spec: Any, num_layers: int) -> KVNamespace:
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    hf_config = getattr(model_config, "hf_config", None)
    hf_dict = hf_config.to_dict() if hf_config is not None else {}
    return KVNamespace.of({
        "weights": _weights(model_config, getattr(vllm_config, "load_config", None)),
        "model": config_digest(hf_dict, ignore=_VOLATILE_CONFIG_KEYS),
        "dtype": getattr(model_config, "dtype", None),
        "quantization": getattr(model_config, "quantization", None),
        "kv_dtype": getattr(cache_config, "cache_dtype", None),
        "geometry": f"{kv_spec}|layers={num_layers}",
        "hash": f"{getattr(cache_config, 'prefix_caching_hash_algo', None)}:seed={os.getenv('PYTHONHASHSEED')}",
    }, label=str(getattr(model_config, "model", "") or ""))
