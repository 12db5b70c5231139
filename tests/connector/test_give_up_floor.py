"""A given-up load's floor holds however the prefill estimate moved between its budget and the
give-up (CI's flake: the engine slowed while the load ran, the floor came out below 1, and the
given-up tier looked clearly cheaper than recomputing again)."""

from __future__ import annotations

from kvoffload.connector.cost.load_choice import LoadDecision, Segment
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


def test_host_memory_warm_up_does_not_load_a_given_up_tier_behind_it() -> None:
    """A hit whose head was promoted into host memory (not timed yet) and whose rest is on the
    given-up disk: the warm-up loads the host part and recomputes the disk part (it loaded the
    whole run: CI's last-phase flake, one more asynchronous disk load after the give-up)."""
    m, _ = model({"CPU": "auto", "DISK": "auto"})
    _timed(m)
    m.load_planned("DISK", 1, 4, cancellable=True)
    m.load_reading("DISK", 1, 0.200)  # past its 80 ms budget: given up
    assert m.overdue() == [1]
    m.load_ended("DISK", 1)
    assert m.tiers["CPU"].loads.samples == 0  # host memory still warming up
    choice = m.choose([Segment("CPU", 2), Segment("DISK", 4)])
    assert (choice.decision, choice.blocks, choice.why) == (LoadDecision.PARTIAL, 2, "warm-up")
    fresh, _ = model({"CPU": "auto", "DISK": "auto"})
    _timed(fresh)  # the disk timed fast and never given up: the warm-up loads the whole run
    assert fresh.choose([Segment("CPU", 2), Segment("DISK", 4)]).blocks == 6
