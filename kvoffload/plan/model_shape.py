"""The KV-cache shape a plan needs from a model: bytes per token (every layer's K and V), read
from a checkpoint's ``config.json`` or the bundled engine's built-in models.

Only the shape is read, so any decoder's config serves (the engine need not run it). Sliding
window layers are counted as full ones: a plan sizes the tiers for the whole prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from kvoffload.errors import describe_value

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}


class ModelShapeError(ValueError):
    """A ``--model`` that gives no KV shape (the value and what to pass instead)."""


@dataclass(frozen=True, slots=True)
class KVShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    #: The model's vocabulary (0: its config does not say): the token ids a log of it may hold.
    vocab_size: int = 0
    #: Weights a token's forward pass multiplies by (attention, MLP, output head; 0: unknown):
    #: its compute is about twice this many FLOPs.
    params: int = 0

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def signature(self) -> str:
        """The shape a prefill's time depends on, as a profile records the model it timed."""
        size = f", {self.params / 1e6:.1f}M parameters" if self.params else ""
        return f"{self.layers} layers, {self.kv_heads} KV heads of {self.head_dim}{size}"


def count_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                 vocab: int) -> int:
    """A decoder's multiplied weights: per layer Q and O (heads x head_dim each way), K and V
    (kv_heads x head_dim), a gated MLP (three hidden x intermediate matrices); and the output
    head. Embeddings are looked up, not multiplied."""
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    return layers * (attention + 3 * hidden * intermediate) + vocab * hidden


def kv_shape(model: str, dtype: str | None = None) -> KVShape:
    """``model``: a built-in model's name (``tiny``, ``small``, ``tiny-hybrid``; the engine's
    float32) or a checkpoint directory; ``dtype`` overrides the KV dtype (fp8 caches, say)."""
    from kvoffload.engine.model_config import BUILTIN_MODELS, ModelConfig

    if model in BUILTIN_MODELS:
        cfg = ModelConfig.tiny(model)
        params = count_params(cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                              cfg.head_dim, cfg.intermediate_size, cfg.vocab_size)
        shape = KVShape(model, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4, cfg.vocab_size, params)
    else:
        shape = _from_config(Path(model))
    if dtype is not None:
        if dtype not in _DTYPE_BYTES:
            raise ModelShapeError(f"--kv-dtype {dtype!r}: use one of {', '.join(_DTYPE_BYTES)}")
        shape = replace(shape, dtype_bytes=_DTYPE_BYTES[dtype])
    return shape


#: Layers, KV heads or head size past this are a broken config, not a model.
MAX_DIMENSION = 1 << 20


def _from_config(path: Path) -> KVShape:
    from kvoffload.engine.model_config import BUILTIN_MODELS

    cfg_file = path / "config.json" if path.is_dir() else path
    if not cfg_file.is_file():
        raise ModelShapeError(f"--model {str(path)!r}: no such model; give a checkpoint directory with a config.json "
                              f"or a built-in model ({', '.join(BUILTIN_MODELS)})")
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelShapeError(f"--model {str(path)!r}: {cfg_file.name} is not readable JSON ({str(exc)[:200]})") from None
    except RecursionError:
        raise ModelShapeError(f"--model {str(path)!r}: {cfg_file.name} is nested too deeply to be a model config") from None
    if not isinstance(raw, dict):
        raise ModelShapeError(f"--model {str(path)!r}: {cfg_file.name} is not a JSON object")
    raw = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    try:
        layers = int(raw["num_hidden_layers"])
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // heads)
        vocab = int(raw.get("vocab_size") or 0)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise ModelShapeError(f"--model {str(path)!r}: {cfg_file.name} lacks the attention shape "
                              f"({type(exc).__name__}: {str(exc)[:100]}); it needs num_hidden_layers, "
                              "num_attention_heads and head_dim or hidden_size") from None
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"
    if min(layers, kv_heads, head_dim) < 1 or max(layers, kv_heads, head_dim) > MAX_DIMENSION:
        raise ModelShapeError(f"--model {str(path)!r}: layers {describe_value(layers)}, KV heads "
                              f"{describe_value(kv_heads)}, "
                              f"head_dim {describe_value(head_dim)}: "
                              f"each must be 1 to {MAX_DIMENSION:,}")
    dtype_bytes = _DTYPE_BYTES.get(dtype, 2) if isinstance(dtype, str) else 2
    params = 0
    hidden, inter = raw.get("hidden_size"), raw.get("intermediate_size")
    if type(hidden) is int and type(inter) is int and 0 < hidden <= MAX_DIMENSION and 0 < inter <= MAX_DIMENSION:
        params = count_params(layers, hidden, heads, kv_heads, head_dim, inter, min(max(vocab, 0), 1 << 24))
    return KVShape(path.name or str(path), layers, kv_heads, head_dim, dtype_bytes, max(vocab, 0), params)
