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
