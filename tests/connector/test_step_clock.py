"""StepClock on CPU: a forward pass's host time is its time, reported at once."""

import time

import torch

from kvoffload.connector.offloading_metadata import StepTiming
from kvoffload.connector.worker.step_clock import StepClock


def test_cpu_steps_report_their_host_time_at_once_and_empty_steps_none():
    clock = StepClock()
    clock.bind(torch.device("cpu"))
    clock.begin(128)
    time.sleep(0.02)
    clock.end(3, 0.005)
    clock.begin(0)  # a step that computed nothing (only copies): not a forward pass to price
    assert clock.end(0, 0.0, load_requests=2, load_host_s=0.001) is False  # the caller keeps its counts
    assert clock.end(0, 0.0) is False  # an end without a begin
    (t,) = clock.take()
    assert (t.tokens, t.sync_blocks, t.sync_wait_s) == (128, 3, 0.005)
    assert 0.02 <= t.seconds < 0.5
    assert clock.take() == []


def test_an_unbound_clock_times_on_the_host():
    clock = StepClock()
    clock.begin(16)
    clock.end(0, 0.0)
    assert [type(t) for t in clock.take()] == [StepTiming]
