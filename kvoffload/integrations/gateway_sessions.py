"""The gateway's conversations (OpenAI's ``user`` field): the replica each one's last turn went
to, and how many conversations each replica has served a turn of lately.

The first is what affinity keeps a returning turn with (its KV is there); the second is how the
gateway spreads conversations that open where no replica holds anything of their prompt. A
conversation stays where it opened for its whole life, so an uneven opening (seven of twelve on
one of two replicas) is an uneven run, and the selection service alone, choosing a burst of
openings against the same load, left one that uneven in 4 of 18 measured runs.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable


class Conversations:
    """Thread-safe. ``max_sessions`` bounds what is remembered (the least recent forgotten);
    a conversation counts toward its replica's load for ``idle_s`` after its last turn."""

    def __init__(self, workers: Iterable[int], max_sessions: int, idle_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not idle_s > 0:
            raise ValueError(f"--session-idle {idle_s}: give seconds > 0, e.g. 300")
        self.workers = sorted(workers)
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._clock = clock
        self._homes: OrderedDict[str, int] = OrderedDict()
        #: The conversations with a turn in the last ``idle_s``, oldest turn first.
        self._recent: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._live = dict.fromkeys(self.workers, 0)
        self._lock = threading.Lock()

    def home(self, session: str) -> int | None:
        """The replica of the conversation's last turn (None: not remembered)."""
        with self._lock:
            return self._homes.get(session)

    def record(self, session: str, worker: int) -> None:
        """The conversation's turn went to ``worker``."""
        with self._lock:
            now = self._clock()
            self._homes[session] = worker
            self._homes.move_to_end(session)
            while len(self._homes) > self.max_sessions:
                self._forget(self._homes.popitem(last=False)[0])
            self._forget(session)
            self._recent[session] = (worker, now)
            self._live[worker] = self._live.get(worker, 0) + 1
            self._expire(now)

    def least_loaded(self, session: str, among: Iterable[int] | None = None) -> list[int]:
        """Of ``among`` (all replicas where None), those with the fewest live conversations,
        this one not counted."""
        candidates = self.workers if among is None else sorted(among)
        with self._lock:
            self._expire(self._clock())
            live = dict(self._live)
            mine = self._recent.get(session)
            if mine is not None:
                live[mine[0]] -= 1
            low = min(live.get(w, 0) for w in candidates)
            return [w for w in candidates if live.get(w, 0) == low]

    def live(self) -> dict[int, int]:
        """Live conversations per replica (a turn within ``idle_s``)."""
        with self._lock:
            self._expire(self._clock())
            return dict(self._live)

    def _forget(self, session: str) -> None:
        turn = self._recent.pop(session, None)
        if turn is not None:
            self._live[turn[0]] -= 1

    def _expire(self, now: float) -> None:
        while self._recent:
            session, (_, at) = next(iter(self._recent.items()))
            if now - at < self.idle_s:
                return
            self._forget(session)
