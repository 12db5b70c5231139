"""Shape of the transformer: the built-in tiny model, or a Hugging Face checkpoint of the Llama
family or Gemma 3 (text): sliding-window and full-attention layers mixed, as ``layer_types``
says."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.errors import require_positive


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int = 258
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_id: int | None = 257
    checkpoint_dir: str | None = None
    #: "llama" (also Mistral, Qwen2) or "gemma3_text".
    model_type: str = "llama"
    #: Per layer: "full_attention" or "sliding_attention" (empty: every layer is full).
    layer_types: tuple[str, ...] = ()
    #: Tokens a sliding layer's query sees, itself included (positions > p - window).
    sliding_window: int | None = None
    #: RoPE base of the sliding layers (full layers use rope_theta); linear scaling factors.
    rope_local_theta: float = 10000.0
    rope_scaling_factor: float = 1.0
    rope_local_scaling_factor: float = 1.0
    #: Attention scale = query_pre_attn_scalar ** -0.5 (None: head_dim, as Llama).
    query_pre_attn_scalar: float | None = None
    hidden_activation: str = "silu"
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            require_positive(f"model {name}", getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}: RoPE needs an even head dimension")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type={self.model_type!r}: the bundled engine runs {', '.join(MODEL_TYPES)}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers; "
                             "give one per layer")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"layer_types: {bad[0]!r} is not implemented; use {' or '.join(LAYER_TYPES)}")
        if "sliding_attention" in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
            raise ValueError(f"sliding_window={self.sliding_window!r}: sliding_attention layers need a window >= 1")
        if self.hidden_activation not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"hidden_activation={self.hidden_activation!r}: use 'silu' or 'gelu_pytorch_tanh'")

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (None: full attention)."""
        if self.layer_types and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @classmethod
    def tiny(cls, size: str = "tiny") -> ModelConfig:
        """Built-in random models: ``tiny`` (tests) and ``small`` (a heavier demo)."""
        if size == "tiny":
            return cls()
        if size == "small":
            return cls(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=32)
        if size == "tiny-hybrid":  # Gemma 3 shaped: 3 sliding layers (window 32) and 1 full one
            return cls(num_hidden_layers=4, model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
                       layer_types=("sliding_attention",) * 3 + ("full_attention",), sliding_window=32,
                       rope_theta=1_000_000.0, query_pre_attn_scalar=16, tie_word_embeddings=True)
        raise ValueError(f"model={size!r}: use 'tiny', 'small', 'tiny-hybrid' or a checkpoint directory "
                         f"(Llama family or Gemma 3)")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read a transformers ``config.json`` of the Llama family."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"model={str(path)!r}: no config.json there; pass a checkpoint directory or a "
                                    f"built-in model ({', '.join(BUILTIN_MODELS)})")
        raw = json.loads(cfg_file.read_text())
        model_type = raw.get("model_type", "llama")
        if model_type == "gemma3_text":
            return _gemma3(raw, cfg_file, path)
        if model_type not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"{cfg_file}: model_type={model_type!r} is not implemented by the bundled engine "
                             "(it runs llama, mistral, qwen2 and gemma3_text checkpoints)")
        rope_theta, rope_factor = _rope(raw.get("rope_parameters") or raw.get("rope_scaling") or {}, raw, cfg_file)
        return cls(
            **_common(raw, path, raw["num_hidden_layers"]),
            rope_theta=rope_theta,
            rope_scaling_factor=rope_factor,
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=raw.get("attention_bias", model_type == "qwen2"),
            mlp_bias=raw.get("mlp_bias", False),
        )


def _common(raw: dict[str, Any], path: Path, layers: int) -> dict[str, Any]:
    """The fields every supported family reads the same way from its HF config (its shape, its
    norm's epsilon, its end-of-sequence token, where it came from)."""
    heads = raw["num_attention_heads"]
    return {"vocab_size": raw["vocab_size"], "hidden_size": raw["hidden_size"],
            "intermediate_size": raw["intermediate_size"], "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": raw.get("num_key_value_heads") or heads,
            "head_dim": raw.get("head_dim") or raw["hidden_size"] // heads,
            "rms_norm_eps": raw.get("rms_norm_eps", 1e-6), "eos_token_id": _eos(raw), "checkpoint_dir": str(path)}


MODEL_TYPES = ("llama", "gemma3_text")
#: ``EngineConfig.model`` names of the built-in random models.
BUILTIN_MODELS = ("tiny", "small", "tiny-hybrid")
LAYER_TYPES = ("full_attention", "sliding_attention")
#: RoPE variants the engine implements: plain rotary embeddings, and linear position scaling.
_ROPE_TYPES = ("default", "linear")


def _rope(params: object, raw: dict, cfg_file: Path, theta_key: str = "rope_theta",
          default_theta: float = 10000.0) -> tuple[float, float]:
    """(base, linear factor) from either config form: ``rope_theta`` (transformers < 5) or
    ``rope_parameters`` (transformers >= 5, which no longer writes the old key). Other scaled
    RoPE types (dynamic, yarn, llama3, ...) change every position's rotation differently:
    refuse them, naming them, rather than silently compute other tokens than transformers."""
    if not isinstance(params, dict):
        raise ValueError(f"{cfg_file}: rope_parameters={params!r} must be a mapping")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"{cfg_file}: RoPE type {rope_type!r} is not implemented by the bundled engine "
                         f"(it implements {', '.join(_ROPE_TYPES)}); use a model without that RoPE scaling")
    theta = params.get("rope_theta", raw.get(theta_key, default_theta))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ValueError(f"{cfg_file}: rope_theta={theta!r} must be a positive number")
    factor = params.get("factor", 1.0) if rope_type == "linear" else 1.0
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise ValueError(f"{cfg_file}: RoPE factor={factor!r} must be a positive number")
    return float(theta), float(factor)


def _eos(raw: dict) -> int | None:
    eos = raw.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos


def _gemma3(raw: dict, cfg_file: Path, path: Path) -> ModelConfig:
    """A transformers ``Gemma3TextConfig``: per-layer types (older configs: a pattern of one full
    layer every ``sliding_window_pattern``), local and global RoPE, QK-norm, soft-capping."""
    n = raw["num_hidden_layers"]
    layer_types = raw.get("layer_types")
    if layer_types is None:
        pattern = raw.get("sliding_window_pattern", 6)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    params = raw.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{cfg_file}: rope_parameters={params!r} must be a mapping")
    full = params.get("full_attention", raw.get("rope_scaling") or {})
    local = params.get("sliding_attention", {})
    theta, factor = _rope(full, raw, cfg_file, default_theta=1_000_000.0)
    local_theta, local_factor = _rope(local, raw, cfg_file, theta_key="rope_local_base_freq")
    return ModelConfig(
        **_common(raw, path, n),
        rope_theta=theta,
        rope_scaling_factor=factor,
        rope_local_theta=local_theta,
        rope_local_scaling_factor=local_factor,
        tie_word_embeddings=raw.get("tie_word_embeddings", True),
        attention_bias=raw.get("attention_bias", False),
        model_type="gemma3_text",
        layer_types=tuple(layer_types),
        sliding_window=raw.get("sliding_window"),
        query_pre_attn_scalar=raw.get("query_pre_attn_scalar", 256),
        hidden_activation=raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh",
        # attn_logit_softcapping is in Gemma 3's config but its attention never applies it
        # (transformers and vLLM alike): it is not read here either.
        final_logit_softcapping=raw.get("final_logit_softcapping"),
    )
