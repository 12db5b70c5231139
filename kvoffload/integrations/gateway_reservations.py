"""Reservation calls off the client's path.

After a request is routed the selection service is told that its prefill is done and then that
it is over. Both are best effort (the service expires reservations on its own), so a client
must not wait on them: with the service stuck, a non-streamed answer used to arrive two
timeouts late and a stream stalled before its first and last chunks. One thread sends them in
order (a prefill's completion before its release); a backlog past ``bound`` is dropped, logged
once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("kvoffload.gateway")

#: Calls waiting to be sent before further ones are dropped.
BOUND = 4096


class ReservationCalls:
    def __init__(self, send: Callable[[str, str], None], bound: int = BOUND) -> None:
        self._send = send
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(bound)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._dropped = False

    def post(self, path: str, method: str) -> None:
        """Send ``method path`` to the service soon; never blocks."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvoffload-gateway-reservations",
                                                daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((path, method))
        except queue.Full:
            if not self._dropped:
                self._dropped = True
                logger.warning("kvoffload gateway: %d reservation calls wait on the selection service; further "
                               "ones are dropped (it expires reservations itself; logged once)", self._queue.maxsize)

    def settle(self, timeout_s: float) -> bool:
        """Wait until every posted call was sent (True), at most ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= end:
                return False
            time.sleep(0.005)
        return True

    def _run(self) -> None:
        while True:
            path, method = self._queue.get()
            try:
                self._send(path, method)
            except Exception:  # best effort: one bad call must not end the thread
                logger.exception("kvoffload gateway: %s %s failed", method, path)
            finally:
                self._queue.task_done()
