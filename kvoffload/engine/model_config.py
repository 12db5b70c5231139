"""Shape of the transformer: the built-in tiny model or a Hugging Face Llama checkpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"model {name}={getattr(self, name)}: must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}: RoPE needs an even head dimension")

    @classmethod
    def tiny(cls, size: str = "tiny") -> ModelConfig:
        """Built-in random models: ``tiny`` (tests) and ``small`` (a heavier demo)."""
        if size == "tiny":
            return cls()
        if size == "small":
            return cls(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=32)
        raise ValueError(f"model={size!r}: use 'tiny', 'small' or a Llama checkpoint directory")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read a transformers ``config.json`` of the Llama family."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"model={str(path)!r}: no config.json there; pass a checkpoint directory")
        raw = json.loads(cfg_file.read_text())
        model_type = raw.get("model_type", "llama")
        if model_type not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"{cfg_file}: model_type={model_type!r} is not a Llama-family model")
        rope_theta = _rope_theta(raw, cfg_file)
        heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=raw.get("attention_bias", model_type == "qwen2"),
            mlp_bias=raw.get("mlp_bias", False),
            eos_token_id=eos,
            checkpoint_dir=str(path),
        )


#: RoPE variants the engine implements (plain rotary embeddings with one base).
_ROPE_TYPES = ("default",)


def _rope_theta(raw: dict, cfg_file: Path) -> float:
    """The RoPE base from either config form: ``rope_theta`` (transformers < 5) or
    ``rope_parameters`` (transformers >= 5, which no longer writes the old key). A scaled RoPE
    (linear, dynamic, yarn, llama3, ...) changes every position's rotation: refuse it, naming it,
    rather than silently compute other tokens than transformers would."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{cfg_file}: rope_parameters={params!r} must be a mapping")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"{cfg_file}: RoPE type {rope_type!r} is not implemented by the bundled engine "
                         f"(it implements {', '.join(_ROPE_TYPES)}); use a model without RoPE scaling")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ValueError(f"{cfg_file}: rope_theta={theta!r} must be a positive number")
    return float(theta)
