"""A model for the benchmarks and tests: a Llama-shaped ``config.json`` that the bundled engine
and vLLM load with random weights (``load_format="dummy"``): real compute, no checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_model(path: Path, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int,
                intermediate: int | None = None) -> None:
    """A Llama-shaped config.json for ``--load-format dummy``: random weights, real compute."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": intermediate or int(hidden * 8 / 3) // 64 * 64, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
           "vocab_size": vocab, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    (path / "config.json").write_text(json.dumps(cfg, indent=1))


def write_model_of(path: Path, args: Any) -> None:
    """The model a benchmark's ``--layers/--hidden/--heads/--kv-heads/--vocab/--intermediate``
    describe (``bench serve``'s own model, and the copy ``--write-log`` keeps beside its log)."""
    write_model(path, args.layers, args.hidden, args.heads, args.kv_heads, args.vocab, args.intermediate)
