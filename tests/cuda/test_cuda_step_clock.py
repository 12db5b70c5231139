"""StepClock on a GPU: a forward pass is timed as the device ran it, not by its launch time."""

import time

import pytest
import torch

from kvoffload.connector.worker.step_clock import StepClock

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_queued_forward_pass_is_reported_at_its_device_time_once_done():
    clock = StepClock()
    clock.bind(torch.device("cuda", torch.cuda.current_device()))
    torch.cuda.synchronize()
    clock.begin(2048)
    t0 = time.perf_counter()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time behind a launch of microseconds
    clock.end(0, 0.0)
    host_s = time.perf_counter() - t0
    early = clock.take()  # not finished yet: nothing reported, the host did not wait
    torch.cuda.synchronize()
    device_s = time.perf_counter() - t0
    late = clock.take()
    assert early == [] and host_s < 0.02
    (t,) = late
    assert t.tokens == 2048
    assert 0.5 * device_s <= t.seconds <= device_s + 0.01
