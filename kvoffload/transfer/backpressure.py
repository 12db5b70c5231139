"""StoreBackpressure: whether a tier should take another store now.

A slow tier (a congested network file system, a drive busy with other work) must not collect
an unbounded queue of stores: each holds host slots and delays what comes after it. A store is
allowed ``per_job_s`` plus ``s_per_mib`` per MiB, from submission to completion (queueing
included); the moving average of each store's time over its allowance is its lateness. While
that average is above 1, or a store still running has already overrun its allowance, new
stores are skipped (the blocks stay in the tiers above; nothing is lost). With nothing in
flight a store is always admitted: it measures the tier afresh, so a tier that recovers is
used again.
"""

from __future__ import annotations

import itertools
import threading
import time

_MIB = float(1 << 20)


class StoreBackpressure:
    def __init__(self, s_per_mib: float | None, per_job_s: float = 0.01, alpha: float = 0.2) -> None:
        if s_per_mib is not None and not s_per_mib > 0:
            raise ValueError(f"s_per_mib={s_per_mib}: must be positive (or None for no bound)")
        self.s_per_mib = s_per_mib
        self.per_job_s = per_job_s
        self.alpha = alpha
        #: Moving average of store time / allowance (above 1: stores are late).
        self.lateness = 0.0
        self.num_skipped = 0
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._running: dict[int, tuple[float, float]] = {}  # token -> (start, allowance)

    def admit(self) -> bool:
        """True: submit the store (and call ``started``); False: skip it (counted)."""
        if self.s_per_mib is None:
            return True
        with self._lock:
            if not self._running:
                return True
            now = time.monotonic()
            overrun = any(now - t0 > allowed for t0, allowed in self._running.values())
            if self.lateness > 1.0 or overrun:
                self.num_skipped += 1
                return False
            return True

    def why_late(self) -> str:
        """Why stores are being skipped, in figures: the stores' average lateness, or the one
        still running past its allowance (before any store has finished, the average says 0)."""
        with self._lock:
            now = time.monotonic()
            overrun = max(((now - t0) / allowed for t0, allowed in self._running.values()), default=0.0)
            if self.lateness > 1.0:
                return f"stores take {self.lateness:.1f}x the time allowed on average"
            return f"a store still running has taken {overrun:.1f}x the time allowed"

    def started(self, nbytes: int) -> int:
        allowed = self.per_job_s + (self.s_per_mib or 0.0) * nbytes / _MIB
        with self._lock:
            token = next(self._ids)
            self._running[token] = (time.monotonic(), allowed)
            return token

    def finished(self, token: int) -> None:
        with self._lock:
            t0, allowed = self._running.pop(token)
            sample = (time.monotonic() - t0) / allowed
            self.lateness = sample if self.lateness == 0.0 else self.alpha * sample + (1 - self.alpha) * self.lateness
