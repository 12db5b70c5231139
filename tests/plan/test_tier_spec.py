"""``--tiers``: chains, sweeps and the one-line errors for what names no chain."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvoffload.plan.tier_spec import (
    MAX_CONFIGURATIONS,
    PlannedTier,
    TierSpecError,
    chain_label,
    expand,
    format_size,
    parse_chain,
    parse_size,
)


def test_a_chain_with_options():
    assert parse_chain("cpu:32GiB+disk:1TiB:arc:wt") == (
        PlannedTier("cpu", 32 << 30), PlannedTier("disk", 1 << 40, "arc", True))
    assert parse_chain("CPU:1.5GiB")[0].size_bytes == 3 << 29
    assert parse_chain("cpu:10GB")[0].size_bytes == 10**10
    assert chain_label(parse_chain("cpu:512MiB+disk:2TiB")) == "cpu:512MiB+disk:2TiB"


def test_a_sweep_is_every_combination_in_order():
    assert expand("cpu:{16,32}GiB+disk:{1,2}TiB") == [
        "cpu:16GiB+disk:1TiB", "cpu:16GiB+disk:2TiB", "cpu:32GiB+disk:1TiB", "cpu:32GiB+disk:2TiB"]
    assert expand("cpu:8GiB") == ["cpu:8GiB"]
    assert [parse_chain(s)[0].size_bytes for s in expand("cpu:{ 1 , 2 }GiB")] == [1 << 30, 2 << 30]


@pytest.mark.parametrize(("spec", "words"), [
    ("", "give a chain"),
    ("gpu:8GiB", "medium 'gpu' is not a tier"),
    ("cpu:8GiB+cpu:4GiB", "cpu appears twice"),
    ("cpu:8", "write a number and a unit"),
    ("cpu:0GiB", "above zero"),
    ("cpu", "needs MEDIUM:SIZE"),
    ("disk:1TiB", "begin with cpu:SIZE"),
    ("cpu:8GiB:wt", "wt on the first tier"),
    ("cpu:8GiB:fifo", "option 'fifo'"),
])
def test_what_names_no_chain_is_told_how_to_write_one(spec, words):
    with pytest.raises(TierSpecError, match=words):
        for s in expand(spec):
            parse_chain(s)


@pytest.mark.parametrize(("spec", "words"), [
    ("cpu:{16,}GiB", "empty value"),
    ("cpu:{{16}}GiB", "no braces inside"),
    ("cpu:{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}GiB+disk:{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17}TiB",
     f"at most {MAX_CONFIGURATIONS}"),
])
def test_a_bad_sweep(spec, words):
    with pytest.raises(TierSpecError, match=words):
        expand(spec)


@given(st.integers(1, 1 << 50))
def test_a_printed_size_reads_back_within_its_rounding(n):
    text = format_size(n)
    back = parse_size(text)
    assert abs(back - n) <= max(1, n // 20), (n, text, back)


def test_plan_sizes_a_tier_kind_a_user_registered(tmp_path, monkeypatch, capsys):
    """The media plan knows come from the registry: a kind registered by a user (here the test
    double of kvoffload.testing) is parsed, replayed with its own spec type, and priced."""
    from kvoffload import cli
    from kvoffload.registry import TIER_KINDS

    monkeypatch.setitem(TIER_KINDS._targets, "memstore", "kvoffload.testing.memory_tier:MemoryKind")
    assert "memstore" in parse_chain("cpu:1MiB+memstore:4MiB")[1].medium
    profile = tmp_path / "p.yaml"
    profile.write_text("kvoffload_profile: 1\nengine: {model: tiny, step_s: 0.001, token_s: 0.00001}\n"
                       "tiers:\n  cpu: {load_gb_per_s: 1, store_gb_per_s: 1}\n"
                       "  memstore: {load_gb_per_s: 0.5, store_gb_per_s: 0.5}\n")
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:256KiB+memstore:4MiB",
                     "--device-blocks", "16", "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    served = next(line for line in out.splitlines() if line.startswith("tokens from memstore"))
    assert int(served.split()[3].replace(",", "")) > 0
    with pytest.raises(TierSpecError, match="medium 'nvme' is not a tier; use cpu, disk, fs, memstore, mooncake"):
        parse_chain("cpu:1MiB+nvme:1GiB")
