"""Building the bundled engine's model: random weights from a seed, or a checkpoint's.

Apart from the model classes (``llama.py`` for Llama, ``gemma3.py`` for Gemma 3, both on the
skeleton in ``layers.py``), so neither model module imports the other.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kvoffload.engine.gemma3 import Gemma3ForCausalLM
from kvoffload.engine.layers import CausalLM, RotaryEmbedding
from kvoffload.engine.llama import LlamaForCausalLM
from kvoffload.engine.model_config import ModelConfig


def build_model(cfg: ModelConfig, seed: int, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """Random weights from ``seed``, or the checkpoint's weights when the config names one."""
    model: nn.Module
    with torch.device("meta"):
        model = Gemma3ForCausalLM(cfg) if cfg.model_type == "gemma3_text" else LlamaForCausalLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    if cfg.checkpoint_dir is not None:
        _load_checkpoint(model, Path(cfg.checkpoint_dir), cfg.tie_word_embeddings)
    else:
        _init_random(model, seed, norm_weight=0.0 if isinstance(model, Gemma3ForCausalLM) else 1.0)
    if isinstance(model, Gemma3ForCausalLM):
        model.build_ropes(device)
    else:
        model.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor).to(device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.eval()
    assert isinstance(model, (LlamaForCausalLM, Gemma3ForCausalLM))
    return model


def _init_random(model: nn.Module, seed: int, norm_weight: float) -> None:
    """Scaled-normal weights: large enough that greedy argmaxes are well separated. Drawn on
    the model's device: on a GPU an 8B-parameter model takes a second, not the minutes the
    host's generator would (the values differ from a CPU model's of the same seed)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(norm_weight)  # Gemma's norms scale by (1 + weight)
            elif name.endswith("bias"):
                p.zero_()
            else:
                fan_in = p.shape[-1] if name != "model.embed_tokens.weight" else 1
                std = 2.0 / fan_in**0.5
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32, device=device) * std)


def _load_checkpoint(model: nn.Module, path: Path, tie_word_embeddings: bool) -> None:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model={str(path)!r}: no *.safetensors files; save the model with save_pretrained")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if "lm_head.weight" not in state and tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    expected = {k for k in model.state_dict() if not k.startswith(("rope.", "ropes."))}
    missing = sorted(expected - state.keys())
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights {missing[:4]}{'...' if len(missing) > 4 else ''}")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name in expected:
            if name in params:
                params[name].copy_(state[name].to(params[name].dtype))
