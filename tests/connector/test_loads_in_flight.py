"""The load cost model with loads in flight: a load running far past its estimate is evidence
before it ends, loads predicted to finish later than recomputing are given up, and what a
layer-wise load costs the step that carries it."""

from __future__ import annotations

import pytest

from kvoffload.connector.cost.load_choice import LoadDecision, Segment
from tests.connector.test_load_cost import _timed, model, teach


def test_a_load_running_far_past_its_estimate_is_evidence_before_it_ends() -> None:
    m, _ = model({"DISK": "auto"})
    _timed(m)
    assert m.choose([Segment("DISK", 4)]).decision is LoadDecision.LOAD
    m.load_planned("DISK", 1, 4, cancellable=True)
    m.load_reading("DISK", 1, 0.020)  # the worker: reading for 20 ms (a 4 ms job): within 4x + 5 ms
    assert m.choose([Segment("DISK", 4)]).decision is LoadDecision.LOAD and m.overdue() == []
    m.load_reading("DISK", 1, 0.050)  # 50 ms: the tier is >= 12.5x slower than fitted
    choice = m.choose([Segment("DISK", 4)])
    # A new load would queue behind the stalled one and be given up before it begins: none is
    # planned (it was priced 50 ms for the job ahead, then its own 4 ms x 12.5, and taken when
    # that still beat recomputing).
    assert choice.decision is LoadDecision.RECOMPUTE and choice.load_s == float("inf")
    assert m.tiers["DISK"].queue.wait_s(m.tiers["DISK"].queue.slowdown()) == pytest.approx(0.050)
    assert m.overdue() == []  # 50 ms < its 64 ms recompute (+25%): it may still be worth waiting for
    m.load_reading("DISK", 1, 0.090)
    assert m.overdue() == [1]  # 90 ms: past what recomputing from the start would have taken
    # What it read is all that is known of the tier now (its history is forgotten).
    assert m.tiers["DISK"].loads.estimate(4) == pytest.approx(0.090)
    m.load_ended("DISK", 1)  # its cancelled result: nothing more to learn
    assert not m.tiers["DISK"].queue.loads
    assert m.choose([Segment("DISK", 4)]).decision is LoadDecision.RECOMPUTE  # until a probe finds it well


def test_a_given_up_load_is_a_verdict_the_tier_keeps_until_one_of_its_loads_completes() -> None:
    """What a given-up load read is a lower bound (the job had not finished), judged against the
    recompute estimate of that moment: an engine that slows afterwards (a busy machine) must not
    make the tier load again, however much slower it gets; a completed load (a probe) measures it."""
    m, clock = model({"DISK": "auto"}, margin=0.25, min_gain_s=0.0)
    _timed(m)
    m.load_planned("DISK", 1, 4, cancellable=True)
    m.load_reading("DISK", 1, 0.090)
    assert m.overdue() == [1]  # read 90 ms: past the 64 ms (+25%) recompute
    m.load_ended("DISK", 1)
    for slower in (0.100, 0.200, 1.0):  # recomputing 4 blocks: ~100 ms, ~200 ms, ~1 s
        for _ in range(60):
            m.observe_step(64, slower)
        choice = m.choose([Segment("DISK", 4)])
        assert choice.decision is LoadDecision.RECOMPUTE, slower
        assert choice.load_s >= 0.090 / 0.064 * choice.recompute_s * 0.99  # still 1.4x recomputing
    clock.now += m.probe_after_s
    probe = m.choose([Segment("DISK", 4)])
    assert probe.why == "probe" and probe.blocks == 4  # the run's head (probe_blocks 8 >= 4)
    m.load_planned("DISK", 2, 4, cancellable=True)
    m.load_ended("DISK", 2, 0.004)  # the probe: the disk is healthy again (4 ms)
    assert m.tiers["DISK"].floor == 0.0
    assert m.choose([Segment("DISK", 4)]).load_s < 0.090  # measured, not floored any more


def test_a_job_queued_for_its_thread_is_no_evidence() -> None:
    """Only reading time counts: a job planned long ago that has not started (its lane busy, the
    copy thread not scheduled) says nothing about the tier."""
    m, clock = model({"DISK": "auto"})
    _timed(m)
    m.load_planned("DISK", 1, 4, cancellable=True)
    clock.now += 5.0  # planned five seconds ago, never reported reading
    assert m.overdue() == [] and m.choose([Segment("DISK", 4)]).decision is LoadDecision.LOAD


def test_loads_queued_behind_a_stalled_one_are_given_up_first() -> None:
    m, _ = model({"DISK": "auto"})
    _timed(m)
    for job in range(1, 7):  # a burst planned in one step: each sees the others' wait
        m.load_planned("DISK", job, 4, cancellable=True)
    assert m.choose([Segment("DISK", 4)]).load_s == pytest.approx(0.028)  # 6 x 4 ms ahead, then its own
    m.load_reading("DISK", 1, 0.050)  # the first has read 50 ms (12.5x): as long again to go, then 50 ms each
    # Recomputing 4 blocks takes 64 ms (82 with the margin): the first may still beat that;
    # the second would end in ~100 ms, the others later.
    assert m.overdue() == [2, 3, 4, 5, 6]
    m.load_planned("DISK", 7, 4, cancellable=False)  # a mode forced it, or it loads layer by layer
    m.load_reading("DISK", 1, 0.250)
    assert m.overdue() == [1]  # never the one without a budget
    assert list(m.tiers["DISK"].queue.loads) == [7]


def test_a_warm_up_load_reading_past_its_budget_is_given_up_and_the_tier_judged() -> None:
    """A tier not timed yet has no estimate to overrun: its warm-up load counts once it has read
    longer than recomputing its blocks would take; then the tier is measured (no more warm-up)."""
    m, _ = model({"DISK": "auto"})
    for tokens in (16, 64, 256, 1024):
        m.observe_step(tokens, tokens * 1e-3)
    assert m.choose([Segment("DISK", 4)]).why == "warm-up"
    m.load_planned("DISK", 1, 4, cancellable=True)
    m.load_reading("DISK", 1, 0.050)
    assert m.overdue() == []  # 50 ms < the 64 ms (+25%) recompute
    m.load_reading("DISK", 1, 0.300)
    assert m.overdue() == [1]
    m.load_ended("DISK", 1)
    choice = m.choose([Segment("DISK", 4)])
    assert (choice.decision, choice.why) == (LoadDecision.RECOMPUTE, "measured")


def test_host_memory_forced_modes_and_failing_engines_never_give_up_a_load() -> None:
    m, _ = model({"CPU": "auto", "DISK": "never-recompute"})
    assert not m.cancellable("CPU") and not m.cancellable("DISK")
    m2, _ = model({"CPU": "auto", "DISK": "auto"})
    assert m2.cancellable("DISK")
    m3, _ = model({"CPU": "auto", "DISK": "auto"}, give_up=False)  # vLLM's kv_load_failure_policy=fail
    assert not m3.cancellable("DISK")


def test_a_layer_wise_load_that_slows_its_step_more_than_a_step_is_loaded_asynchronously() -> None:
    """The copy alone is fast (10 µs a block), but steps that carried layer-wise loads of 4 blocks
    waited 30 ms for their layers (the copy lane busy): the wait an asynchronous load costs (a
    step, 10 ms) is the cheaper one."""
    m, clock = model()
    teach(m, cpu_s_per_block=1e-5, disk_latency=0.0, disk_per_block=1e-5)
    for _ in range(20):
        m.observe_step(256, 0.01)
    assert m.choose([Segment("CPU", 4)], sync_possible=True).sync
    step = m.prefill.seconds(256)  # ~10 ms (the taught 25.6 ms nearly forgotten)
    for _ in range(3):
        m.observe_step(256, step + 0.03, sync_blocks=4, sync_wait_s=0.03)
    assert m.sync_stall.estimate(4) == pytest.approx(0.03)
    assert not m.choose([Segment("CPU", 4)], sync_possible=True).sync
    assert m.prefill.seconds(256) == pytest.approx(step)  # the engine's rate is not what the loads cost
    # Once the stall's measurement is stale, one hit loads layer by layer again to measure it.
    clock.now += m.probe_after_s
    assert m.choose([Segment("CPU", 4)], sync_possible=True).sync
    assert not m.choose([Segment("CPU", 4)], sync_possible=True).sync
    # Steps that lose nothing to their layer-wise loads bring the choice back.
    for _ in range(40):
        m.observe_step(256, 0.01, sync_blocks=4)
    assert m.choose([Segment("CPU", 4)], sync_possible=True).sync


def test_a_steps_time_past_its_size_is_charged_to_its_copies_only_up_to_their_own_time() -> None:
    """A returning turn's 128 tokens attend to the 1,280 tokens loaded for them: its step runs
    40 ms past a 128-token prefill without waiting for any layer, against copies of 4.5 ms. The
    loads lost at most what the copies took; the rest is the step's own work (an asynchronous
    load pays it too), which the prefill rate learns: it was charged to the loads before, the
    prefill rate never learnt it, and the stall outgrew a decode step (the bundled chat
    benchmark then loaded 5 of 24 returning turns asynchronously, each waiting a step)."""
    m, _ = model()
    teach(m, cpu_s_per_block=5e-5, s_per_token=1.6e-3)  # 90 blocks: 4.5 ms; 128 tokens: 205 ms
    copies = m.tiers["CPU"].loads.estimate(90)
    for _ in range(5):
        m.observe_step(128, 0.245, sync_blocks=90)
    assert m.sync_stall.estimate(90) == pytest.approx(copies, rel=0.05)
    assert m.prefill.seconds(128) > 0.205 + 0.01  # the steps' own time, less the copies', is the engine's
    m.step_s = 0.05  # decode steps of 50 ms
    assert m.choose([Segment("CPU", 90)], sync_possible=True).sync
    # Before the host tier's copies are timed, nothing caps what a step's excess says.
    fresh, _ = model()
    fresh.observe_step(128, 0.205)
    fresh.observe_step(128, 0.245, sync_blocks=90)
    assert fresh.sync_stall.estimate(90) == pytest.approx(0.04)


def test_a_steps_wait_for_its_layers_is_the_loads_cost_and_not_the_engines() -> None:
    m, _ = model()
    teach(m, cpu_s_per_block=1e-5, disk_latency=0.0, disk_per_block=1e-5)
    before = m.prefill.seconds(256)
    for _ in range(5):
        m.observe_step(256, 0.0256 + 0.05, sync_blocks=8, sync_wait_s=0.05)  # 50 ms waiting for layers
    assert m.prefill.seconds(256) == pytest.approx(before)  # 1e-4 s a token, as taught
    assert m.sync_stall.estimate(8) == pytest.approx(0.05)
    assert not m.choose([Segment("CPU", 8)], sync_possible=True).sync  # 50 ms lost > a 25.6 ms step
    assert m.gauges()["kvoffload_layerwise_stall_seconds"]["per_block"] == pytest.approx(0.05 / 8)
