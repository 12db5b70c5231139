"""Whole-call deadlines for the gateway's sockets.

A socket timeout bounds each receive, not a call: an upstream that sends its answer a byte
every half second, or a client that sends its request a byte every nine seconds, is never
silent long enough to time out and held a thread for as long as it liked. One watchdog thread
shuts a socket down when its call's deadline passes; the blocked reader wakes with an empty
read or an error, and the caller asks its ``Alarm`` whether the deadline was the cause.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Alarm:
    """One armed deadline: ``fired`` once the watchdog shut the socket down."""

    sock: socket.socket
    deadline: float
    lock: threading.Lock = field(repr=False)
    fired: bool = False
    cancelled: bool = field(default=False, repr=False)

    def disarm(self) -> None:
        """From here on the socket is the caller's again: a deadline that already fired has
        shut it down (``fired``), one that has not never will."""
        with self.lock:
            self.cancelled = True

    def __enter__(self) -> Alarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()


class Watchdog:
    """Shuts armed sockets down at their deadlines; one daemon thread, started on first use."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        #: Held while an alarm fires or is disarmed, so a disarmed socket is never shut down.
        self._fire_lock = threading.Lock()

    def arm(self, sock: socket.socket, seconds: float) -> Alarm:
        alarm = Alarm(sock, time.monotonic() + seconds, self._fire_lock)
        with self._cond:
            heapq.heappush(self._heap, (alarm.deadline, next(self._order), alarm))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvoffload-gateway-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
        return alarm

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                alarm = heapq.heappop(self._heap)[2]
            with self._fire_lock:
                if alarm.cancelled:
                    continue
                alarm.fired = True
                with contextlib.suppress(OSError):  # already closed: its call is over
                    alarm.sock.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()
