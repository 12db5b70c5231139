"""A given-up load's floor holds however the prefill estimate moved between its budget and the
give-up (CI's flake: the engine slowed while the load ran, the floor came out below 1, and the
given-up tier looked clearly cheaper than recomputing again)."""

from __future__ import annotations

from kvoffload.connector.load_cost import LoadDecision, Segment
from tests.connector.test_load_cost import _timed, model


def test_a_load_given_up_after_the_engine_slowed_keeps_its_tier_recomputed() -> None:
    m, _ = model({"DISK": "auto"}, margin=0.25, min_gain_s=0.0)
    _timed(m)  # a 4-block hit: 4 ms to load, 64 ms to recompute
    m.load_planned("DISK", 1, 4, cancellable=True)  # its budget: 64 ms x 1.25 = 80 ms
    for _ in range(60):
        m.observe_step(64, 0.300)  # the machine got busy: recomputing 4 blocks now ~300 ms
    m.load_reading("DISK", 1, 0.090)  # read 90 ms: past its budget, a third of today's recompute
    assert m.overdue() == [1]
    m.load_ended("DISK", 1)
    assert m.tiers["DISK"].floor >= 1.25  # the budget's margin, not 0.09 / 0.30
    for _ in range(60):
        m.observe_step(64, 0.064)  # and the engine recovers: the floor keeps its ratio
    choice = m.choose([Segment("DISK", 4)])
    assert choice.decision is LoadDecision.RECOMPUTE
    assert choice.load_s >= 1.25 * choice.recompute_s * 0.99
