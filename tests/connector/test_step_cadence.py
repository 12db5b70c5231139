"""StepCadence: the steps that computed nothing, timed from one step's planning to the next's,
sampled only where a load kept the engine stepping."""

from __future__ import annotations

import pytest

from kvoffload.connector.cost.step_cadence import StepCadence


def test_empty_steps_beside_a_load_are_its_overheads():
    now = [0.0]
    c = StepCadence(clock=lambda: now[0])

    def step(seconds: float, tokens: int = 0, sent: int = 0, pending: int = 0) -> None:
        c.step(tokens, sent, pending)
        now[0] += seconds

    assert c.gauges() == {}
    step(0.010, tokens=512)  # a computing step: never sampled
    step(0.003, sent=2, pending=2)  # sends two loads off: 1.5 ms each
    step(0.001, pending=2)  # waits for them: idle steps
    step(0.002, pending=1)
    step(0.004)  # nothing pending, nothing computed: the engine may have waited for requests
    step(0.020, tokens=64)
    step(0.0)
    got = c.gauges()
    assert got["idle_step"] == pytest.approx(0.0015)  # median of 1 and 2 ms
    assert got["per_load"] == pytest.approx(0.0015 - 0.0015)
    step(0.005, sent=1, pending=1)
    step(0.0)
    assert c.gauges()["per_load"] == pytest.approx((0.0015 + 0.005) / 2 - 0.0015)


def test_the_window_keeps_the_latest_steps():
    now = [0.0]
    c = StepCadence(clock=lambda: now[0], window=3)
    for seconds in (0.001, 0.001, 0.001, 0.009, 0.009, 0.009):
        c.step(0, 0, 1)
        now[0] += seconds
    c.step(0, 0, 1)
    assert c.gauges() == {"idle_step": pytest.approx(0.009)}  # a slower spell shows
