"""StepCadence: the engine's steps as the scheduler half sees them come round (one step's
planning to the next's), for the two figures a sizing tool prices a load's way through the
engine with besides its copy: a step that computes nothing while a load is on its way (the
engine learns a load landed only at a step's end), and what sending a load off adds to the step
that sends it. Medians of the latest steps of each kind: a slower spell shows within a window.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable


class StepCadence:
    def __init__(self, clock: Callable[[], float] = time.monotonic, window: int = 64) -> None:
        self.clock = clock
        self._last_at: float | None = None
        self._last: tuple[int, int, int] = (0, 0, 0)  # the previous step's tokens, loads sent, loads pending
        self._idle: deque[float] = deque(maxlen=window)
        self._per_load: deque[float] = deque(maxlen=window)

    def step(self, tokens: int, loads_sent: int, loads_pending: int) -> None:
        """A step was planned: ``tokens`` computed in it, ``loads_sent`` loads sent off, with
        ``loads_pending`` loads on their way. The previous step took until now: it is sampled
        if it computed nothing and a load kept the engine stepping (else the engine may have
        been waiting for requests)."""
        now = self.clock()
        if self._last_at is not None:
            seconds = now - self._last_at
            tokens_before, sent, pending = self._last
            if tokens_before == 0 and sent:
                self._per_load.append(seconds / sent)
            elif tokens_before == 0 and pending:
                self._idle.append(seconds)
        self._last_at = now
        self._last = (tokens, loads_sent, loads_pending)

    def gauges(self) -> dict[str, float]:
        """``idle_step`` seconds, and ``per_load`` seconds a load adds to the step sending it."""
        out: dict[str, float] = {}
        idle = statistics.median(self._idle) if self._idle else 0.0
        if self._idle:
            out["idle_step"] = idle
        if self._per_load:
            out["per_load"] = max(statistics.median(self._per_load) - idle, 0.0)
        return out
