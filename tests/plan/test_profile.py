"""The profile: prices, its YAML round trip, the shipped one, and what a bad one is told."""

from __future__ import annotations

import math

import pytest
import yaml

from kvoffload.plan.profile import EngineSpeed, Profile, ProfileError, TierSpeed, load_profile, parse_profile


def profile() -> Profile:
    return Profile(EngineSpeed("tiny", 0.001, 2e-5, 1e-8, 256, 3e-4),
                   {"cpu": TierSpeed(5.0, 4.0, 1e-4, 2e-4), "disk": TierSpeed(1.0, 0.5, 1e-3)}, "here")


def test_round_trip(tmp_path):
    p = profile()
    p.save(tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml") == p


def test_prices():
    eng = profile().engine
    # 600 new tokens after 100 cached: 3 steps of 256 tokens.
    assert eng.prefill_s(600, 100) == pytest.approx(3 * 0.001 + 600 * 2e-5 + 600 * (100 + 300) * 1e-8)
    assert eng.prefill_s(0) == 0.001  # a full hit still runs the step that samples
    cpu = profile().tier("cpu")
    assert cpu.load_s(10**9) == pytest.approx(1e-4 + 0.2) and cpu.load_s(0) == 0.0
    assert cpu.store_s(4 * 10**9) == pytest.approx(2e-4 + 1.0)


def test_the_shipped_profile_prices_cpu_and_disk():
    p = load_profile(None)
    assert set(p.tiers) >= {"cpu", "disk"} and p.engine.token_s > 0 and p.engine.max_batched_tokens >= 1


def test_a_tier_the_profile_lacks_names_the_fix():
    with pytest.raises(ProfileError, match=r"tier 'mooncake': the profile has no speeds for it \(it has cpu, disk\)"):
        profile().tier("mooncake")


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d.pop("kvoffload_profile"), "not a kvoffload profile"),
    (lambda d: d["engine"].update(token_s=-1), r"engine.token_s = -1"),
    (lambda d: d["engine"].update(token_s=math.nan), r"engine.token_s = nan"),
    (lambda d: d["engine"].update(step_s=True), r"engine.step_s = True"),
    (lambda d: d["engine"].update(max_batched_tokens=0), r"engine.max_batched_tokens = 0"),
    (lambda d: d["tiers"]["cpu"].update(load_gb_per_s=0), r"tiers.cpu.load_gb_per_s = 0"),
    (lambda d: d["tiers"].update(disk="fast"), r"tiers.disk: give load_gb_per_s"),
    (lambda d: d.update(engine=[1]), "engine: give step_s"),
])
def test_a_bad_profile_names_the_key(edit, words):
    doc = yaml.safe_load(profile().to_yaml())
    edit(doc)
    with pytest.raises(ProfileError, match=words):
        parse_profile(doc)


def test_a_missing_or_broken_file(tmp_path):
    with pytest.raises(ProfileError, match="no such file; write one with `kvoffload bench profile"):
        load_profile(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("engine: [\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(tmp_path / "bad.yaml")


def test_bench_profile_writes_a_profile_plan_reads(tmp_path, capsys):
    """The measured profile round trip: the benchmark's YAML loads, and prices a plan."""
    from kvoffload import cli

    out = tmp_path / "p.yaml"
    assert cli.main(["bench", "profile", "--out", str(out), "--tiers", "cpu", "--reps", "1"]) == 0
    p = load_profile(out)
    assert set(p.tiers) == {"cpu"} and p.engine.model == "tiny" and p.engine.max_batched_tokens == 512
    # It says which model it timed, so a plan for another model refuses it (tests/plan/test_plan_cli.py).
    assert p.engine.shape == "2 layers, 2 KV heads of 16, 0.1M parameters" and p.engine.params == 90240
    assert p.tiers["cpu"].load_gb_per_s > 0 and p.engine.token_s > 0
    # What a load costs the steps besides its copy: the steps that waited for one, and those that sent one off.
    assert p.engine.idle_step_s > 0 and p.engine.load_step_s >= 0
    text = capsys.readouterr().out
    assert "plain memory copy" in text and "an idle step" in text
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB", "--profile", str(out)]) == 0
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB+disk:1GiB",
                     "--profile", str(out)]) == 2
    assert "tier 'disk'" in capsys.readouterr().err


def test_load_overheads_are_the_steps_that_computed_nothing():
    from kvoffload.bench.profile_bench import load_overheads

    def row(tokens=0, decodes=0, loads=0):
        return {"step_s": 1.0, "token_s": tokens, "attention_s": 0.0, "decode_s": decodes, "decode_context_s": 0.0,
                "load_step_s": loads}

    steps = [(row(), 0.4e-3), (row(), 0.5e-3), (row(), 0.3e-3), (row(loads=2), 2.0e-3), (row(loads=1), 1.2e-3),
             (row(tokens=64, loads=1), 9e-3), (row(decodes=3), 2e-3)]
    idle, load = load_overheads(steps)
    assert idle == pytest.approx(0.4e-3)  # the three that only waited
    assert load == pytest.approx(1.1e-3 - 0.4e-3)  # 1.0 and 1.2 ms a load sent, less an idle step
    assert load_overheads([(row(tokens=5), 1e-3)]) == (0.0, 0.0)
