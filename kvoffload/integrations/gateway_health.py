"""Which replicas the gateway can send to now.

Two ways a replica drops out for a while: it cannot be reached (a dead ``vllm serve``: the
selection service still lists its blocks, since a dead engine sends no removal events, so the
service would keep choosing it for the conversations it held), or the selection service
refuses to choose it (it was never registered there, or the service lost it; Dynamo 1.6.1
answers 503 to an ``allowed_worker_ids`` it cannot serve). Either way the gateway stops naming
it, as a conversation's home or an opening's target, until ``retry_s`` has passed; then one
request finds out again (and goes elsewhere if it still fails).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

logger = logging.getLogger("kvoffload.gateway")

#: Seconds a replica found dead or unchoosable is left out before it is tried again.
RETRY_S = 10.0


class ReplicaHealth:
    """Thread-safe; a replica's state changes are logged once per change, with the cause."""

    def __init__(self, workers: Iterable[int], retry_s: float = RETRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = sorted(workers)
        self.retry_s = retry_s
        self._clock = clock
        self._out: dict[int, float] = {}
        self._lock = threading.Lock()

    def leave_out(self, worker: int, why: str) -> None:
        """Stop naming ``worker`` for ``retry_s`` (it was unreachable, or refused)."""
        with self._lock:
            fresh = worker not in self._out
            self._out[worker] = self._clock() + self.retry_s
        if fresh:
            logger.warning("kvoffload gateway: replica %d left out for %g s: %s", worker, self.retry_s, why)

    def usable(self, avoid: Iterable[int] = ()) -> list[int]:
        """The replicas to name now, less ``avoid``; when every other replica is left out,
        all of those (a fleet that is all down is still asked rather than refused unasked)."""
        avoided = set(avoid)
        now = self._clock()
        with self._lock:
            for worker in [w for w, until in self._out.items() if until <= now]:
                del self._out[worker]
            candidates = [w for w in self.workers if w not in avoided]
            up = [w for w in candidates if w not in self._out]
        return up or candidates
