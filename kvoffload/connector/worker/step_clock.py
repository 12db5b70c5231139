"""StepClock: how long each forward pass took, as the device ran it.

The cost model prices recomputing by the forward passes' time. On CPU the pass's host time is
that time. On CUDA the forward returns once its kernels are queued: its host time is the
launch overhead, which for a compute-bound model is a fraction of what the device then takes
(so recomputing a prefix looked several times cheaper than it was). There each step records a
CUDA event on the compute stream where it begins and where it ends, and is reported once its
end event has passed (a step or so later; the host never waits for it), as the longer of its
host time and the device's time between the two events.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

import torch

from kvoffload.connector.offloading_metadata import StepTiming

#: Steps kept waiting for their end event; past this the oldest is reported on host time alone.
MAX_PENDING = 64


@dataclass(slots=True)
class _Pending:
    timing: StepTiming
    start: torch.cuda.Event
    end: torch.cuda.Event


class StepClock:
    def __init__(self) -> None:
        self.device: torch.device | None = None
        self._cuda = False
        self._start_s: float | None = None
        self._start_event: torch.cuda.Event | None = None
        self._tokens = 0
        self._pending: deque[_Pending] = deque()
        self._done: list[StepTiming] = []

    def bind(self, device: torch.device) -> None:
        """The device the forward passes run on (its KV caches')."""
        self.device = device
        self._cuda = device.type == "cuda"

    def begin(self, tokens: int) -> None:
        """A forward pass of ``tokens`` is about to be queued."""
        self._start_s, self._tokens = time.perf_counter(), tokens
        self._start_event = None
        if self._cuda and tokens > 0:
            self._start_event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._start_event.record(torch.cuda.current_stream(self.device))

    def end(self, sync_blocks: int, sync_wait_s: float, load_requests: int = 0, load_host_s: float = 0.0) -> bool:
        """The forward pass is queued (or done, on CPU): its timing is reported when known.
        False for a step that computed nothing (not reported: the caller keeps its load counts)."""
        if self._start_s is None or self._tokens <= 0:
            self._start_s = None
            return False
        timing = StepTiming(self._tokens, time.perf_counter() - self._start_s, sync_blocks, sync_wait_s,
                            load_requests, load_host_s)
        self._start_s = None
        if self._start_event is None:
            self._done.append(timing)
            return True
        assert self.device is not None
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end.record(torch.cuda.current_stream(self.device))
        self._pending.append(_Pending(timing, self._start_event, end))
        self._start_event = None
        if len(self._pending) > MAX_PENDING:
            self._done.append(self._pending.popleft().timing)
        return True

    def take(self) -> list[StepTiming]:
        """The steps whose time is known now, oldest first."""
        while self._pending and self._pending[0].end.query():  # type: ignore[no-untyped-call]
            p = self._pending.popleft()
            device_s = p.start.elapsed_time(p.end) / 1e3
            t = p.timing
            self._done.append(replace(t, seconds=max(t.seconds, device_s)))
        done, self._done = self._done, []
        return done
