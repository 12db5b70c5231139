"""`kvoffload bench profile --engine vllm`: vLLM's own steps timed offline and fitted into the
profile `kvoffload plan` prices a vLLM server with."""

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")


def test_bench_profile_times_vllms_steps_into_a_profile_plan_reads(tmp_path, capsys):
    """On a config.json alone (what bench serve --write-log keeps): random weights, the same compute."""
    from kvoffload.bench.dummy_model import write_model
    from kvoffload.bench.profile_bench import main
    from kvoffload.plan.profile import load_profile

    model = str(tmp_path / "served-model")
    write_model(tmp_path / "served-model", layers=2, hidden=128, heads=4, kv_heads=2, vocab=512)
    out = tmp_path / "vllm_profile.yaml"
    assert main(["--engine", "vllm", "--model", model, "--max-model-len", "1024", "--max-batched-tokens", "256",
                 "--dtype", "float32", "--tiers", "cpu", "--reps", "1", "--out", str(out)]) == 0
    profile = load_profile(str(out))
    engine = profile.engine
    assert engine.model == model and engine.max_batched_tokens == 256
    assert engine.token_s > 0  # a prefill token costs something: the fit saw prefills of 16 to 512 tokens
    # A 512-token prompt takes two steps of the 256-token budget: more than a 16-token one.
    assert engine.prefill_s(512) > engine.prefill_s(16) > 0
    assert set(profile.tiers) == {"cpu"} and profile.tiers["cpu"].load_gb_per_s > 0
    text = capsys.readouterr().out
    assert "engine (" in text and "no weight files there; timing its shape with random weights" in text
    assert engine.shape == "2 layers, 2 KV heads of 32, 0.4M parameters"  # plan --model served-model takes it
    with pytest.raises(ValueError, match="checkpoint directory"):
        main(["--engine", "vllm", "--model", "tiny", "--out", str(out)])
