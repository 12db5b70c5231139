"""The answer `kvoffload plan` gives: it never recommends making time to first token worse
without saying so, leaves out tiers that served nothing, says when offload is not needed, and
always states the working set."""

from __future__ import annotations

from kvoffload.plan.advice import advise
from kvoffload.plan.planner import PlanResult, TierFigures

GIB = 1 << 30


def _result(label: str, tiers: list[tuple[str, int, int]], saved_s: float, p50: float, p95: float,
            base: tuple[float, float] = (0.060, 0.090)) -> PlanResult:
    figures = [TierFigures(medium, size, tokens, tokens * 64, 0, 1e6 if tokens else 0.0, 0.0, 2e6 if tokens else 0.0)
               for medium, size, tokens in tiers]
    served = sum(t[2] for t in tiers)
    return PlanResult(label, sum(t[1] for t in tiers), figures, 100_000, 10_000, served, saved_s, p50, p95, *base, 50)


def test_a_configuration_that_makes_ttft_worse_is_not_recommended_over_one_that_does_not():
    """The issue's case: "Buy cpu:64MiB+disk:64GiB" at a p95 of 916.5 ms against 56.0 ms."""
    small = _result("cpu:64MiB+disk:64GiB", [("cpu", 64 << 20, 20_000), ("disk", 64 * GIB, 30_000)], 9.9, 0.040, 0.9165)
    big = _result("cpu:512MiB+disk:64GiB", [("cpu", 512 << 20, 48_000), ("disk", 64 * GIB, 2_000)], 9.0, 0.030, 0.050)
    advice = advise([small, big], working_set_bytes=4 * GIB, device_bytes=512 << 20)
    assert advice.recommended is big and advice.buy_label == "cpu:512MiB+disk:64GiB"
    assert advice.paragraph.startswith("Buy cpu:512MiB+disk:64GiB")
    assert "cpu:64MiB+disk:64GiB saves more prefill (9.9 s) but makes TTFT worse (p50 40.0 ms, p95 916.5 ms)" \
        in advice.paragraph
    assert advice.paragraph.endswith("The log's working set (the KV of every distinct block it stores) is 4GiB; "
                                     "the device cache, 512MiB, holds 12% of it.")


def test_when_every_configuration_is_worse_the_answer_says_so_first():
    a = _result("cpu:1GiB", [("cpu", GIB, 10_000)], 2.0, 0.080, 0.100)
    b = _result("cpu:2GiB", [("cpu", 2 * GIB, 12_000)], 2.5, 0.070, 0.200)
    advice = advise([a, b], working_set_bytes=3 * GIB, device_bytes=GIB)
    assert advice.paragraph.startswith("Every configuration tried makes returning requests' time to first token "
                                       "worse than without offload")
    assert advice.recommended is b  # the most prefill saved (within 5%), and it is named as the least harmful


def test_tiers_that_served_nothing_are_left_out_of_what_to_buy():
    """The README's form: a 1 TiB disk that served 0 tokens was part of "buy 1,040 GiB"."""
    r = _result("cpu:16GiB+disk:1TiB", [("cpu", 16 * GIB, 40_000), ("disk", 1 << 40, 0)], 12.0, 0.030, 0.040)
    advice = advise([r], working_set_bytes=10 * GIB, device_bytes=8 * GIB)
    assert advice.buy_label == "cpu:16GiB" and advice.buy_bytes == 16 * GIB
    assert advice.paragraph.startswith("Buy cpu:16GiB (16GiB in all)")
    assert "Its disk tier (cpu:16GiB+disk:1TiB) served nothing on this log: leave it out." in advice.paragraph
    # A tier above one that served is kept: the blocks reach the lower one through it.
    mid = _result("cpu:1GiB+disk:8GiB+fs:64GiB", [("cpu", GIB, 0), ("disk", 8 * GIB, 0), ("fs", 64 * GIB, 9_000)],
                  3.0, 0.030, 0.040)
    assert advise([mid], working_set_bytes=GIB, device_bytes=0).buy_label == "cpu:1GiB+disk:8GiB+fs:64GiB"


def test_when_nothing_pays_the_answer_says_why_and_recommends_nothing():
    r = _result("cpu:8GiB+disk:256GiB", [("cpu", 8 * GIB, 0), ("disk", 256 * GIB, 0)], 0.0, 0.050, 0.080)
    fits = advise([r], working_set_bytes=GIB, device_bytes=2 * GIB)
    assert fits.recommended is None and fits.buy_label == ""
    assert fits.paragraph.startswith("Offload is not needed for this log: the device cache holds its working set")
    assert "is 1GiB; the device cache, 2GiB, holds it." in fits.paragraph
    short = advise([r], working_set_bytes=300 * GIB, device_bytes=2 * GIB)
    assert short.recommended is None and short.paragraph.startswith("No configuration tried serves anything")
    assert "Try tiers of at least 298GiB" in short.paragraph
