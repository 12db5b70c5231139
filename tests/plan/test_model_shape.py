"""kv_shape reads a checkpoint's attention shape and vocabulary the same way for every caller
(the plan, its validation benchmark, the vLLM profile): a multimodal config's text_config too."""

from __future__ import annotations

import json

import pytest

from kvoffload.plan.model_shape import ModelShapeError, kv_shape

TEXT = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512,
        "vocab_size": 262208, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("config", [TEXT, {"architectures": ["Gemma3ForConditionalGeneration"], "vocab_size": 7,
                                           "text_config": TEXT}])
def test_shape_and_vocabulary_come_from_the_text_model(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = kv_shape(str(tmp_path))
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.dtype_bytes) == (4, 2, 64, 2)
    assert shape.vocab_size == 262208  # the text model's, not the wrapper's
    assert kv_shape(str(tmp_path), "fp8").vocab_size == 262208  # a KV dtype override keeps it


def test_a_config_without_a_vocabulary_says_zero_and_built_ins_have_theirs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in TEXT.items() if k != "vocab_size"}))
    assert kv_shape(str(tmp_path)).vocab_size == 0
    assert kv_shape("tiny").vocab_size == 258
    with pytest.raises(ModelShapeError, match="no such model"):
        kv_shape(str(tmp_path / "missing"))
