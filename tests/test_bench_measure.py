"""Benchmark figures are medians with their spread, ratios are run by run, and a busy machine
is named before any figure."""

from __future__ import annotations

import os

from kvoffload.bench.measure import Sample, interleaved, load_warning, preamble


def test_median_spread_and_run_by_run_ratio():
    a, b = Sample((3.0, 1.0, 2.0)), Sample((1.0, 2.0, 1.0))
    assert (a.median, a.spread) == (2.0, 1.0)
    assert a.ratio(b).values == (3.0, 0.5, 2.0)
    assert a.fmt(".1f") == "2.0 ±1.0" and a.fmt(".0f", 1e3) == "2000 ±1000"


def test_interleaved_alternates_the_figures():
    calls: list[str] = []
    out = interleaved({"x": lambda: calls.append("x") or 1.0, "y": lambda: calls.append("y") or 2.0}, 3)
    assert calls == ["x", "y"] * 3 and out["y"].values == (2.0, 2.0, 2.0)


def test_a_busy_machine_is_named(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.0, 1.0))
    assert "busy (1-minute load 1.9 on 2 cores)" in (load_warning() or "")
    assert preamble(5).startswith("figures: median ± half-range of 5 runs\nwarning:")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.1, 0.1))
    assert load_warning() is None and preamble(3) == "figures: median ± half-range of 3 runs"
