"""SessionOrder: the hinted policy's sessions by predicted next use, per priority.

A session's prediction is ``due = last + expect`` until then, and ``now + overdue_factor *
(now - due)`` once it is late. Per priority, two lazy heaps give the session predicted back
last: one by due time for the sessions not late yet, one by how long they have been late (the
longest late is predicted furthest off); a third turns sessions from the first to the second as
they fall due. Entries go stale when a session is hinted again (it gets a new version, unique
over all sessions, so a session forgotten and hinted again never matches its old entries) and
are dropped as they surface, or all at once when the heaps fill up with them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, field

from kvoffload.offload.hints import show

#: Heap entries: (key, version, session key).
_Entry = tuple[float, int, Hashable]


@dataclass(slots=True)
class Session:
    name: Hashable
    last: float = 0.0
    expect: float = 0.0
    priority: int = 0
    lease_until: float | None = None
    #: Its lease is live and its blocks count in the lease share (``HintShares.leased_blocks``).
    lease_live: bool = False
    lease_seq: int = 0
    version: int = 0
    #: Its blocks in the tier by prefix position of its last request (deepest last), the same
    #: as a set, and the ones earlier requests used and the last did not (evicted first).
    #: Entries go stale when a block leaves; a block in ``live`` is never treated as dead.
    chain: list[Hashable] = field(default_factory=list)
    live: set[Hashable] = field(default_factory=set)
    dead: list[Hashable] = field(default_factory=list)
    blocks: int = 0
    #: It has a live entry in its order's heaps (dropped while it held no block).
    queued: bool = False
    #: Whose session it is (``BlockHint.tenant``), and the blocks it holds that a session of
    #: another tenant held before it (``HintedCachePolicy.displaced`` says whose).
    tenant: bytes | None = None
    adopted: set[Hashable] = field(default_factory=set)


def session_label(name: Hashable) -> str:
    """A session's name as a log line shows it: the client's name without its tenant digest,
    anything else bounded (``show``)."""
    shown = name[1] if isinstance(name, tuple) and len(name) == 2 and isinstance(name[1], str) else name
    return shown if isinstance(shown, str) and shown.isprintable() else show(shown)


class SessionOrderHeaps:
    """Sessions of one priority by predicted next use (lazy heaps, stale entries skipped)."""

    def __init__(self) -> None:
        self.sched: list[_Entry] = []  # (-(last + expect), version, name)
        self.trans: list[_Entry] = []  # (time it turns overdue, version, name)
        self.overdue: list[_Entry] = []  # (when it was due, version, name): longest late first


class SessionOrder:
    def __init__(self, sessions: dict[Hashable, Session], overdue_factor: float, slack: int = 64) -> None:
        #: The policy's sessions (shared, not copied): heap entries name them.
        self.sessions = sessions
        self.alpha = overdue_factor
        self.orders: dict[int, SessionOrderHeaps] = {}
        self.slack = slack
        self._versions = itertools.count(1)
        #: Heap entries, stale ones included (compacted past four a session plus ``slack``).
        self._entries = 0

    def next_version(self) -> int:
        return next(self._versions)

    def predicted(self, s: Session, now: float) -> float:
        """When ``s`` is expected back, on the hints' clock."""
        due = s.last + s.expect
        return due if now <= due else now + self.alpha * (now - due)

    def push(self, s: Session) -> None:
        """``s`` as it is now (hinted, or holding blocks again) takes its place."""
        s.version = self.next_version()
        s.queued = True
        order = self.orders.setdefault(s.priority, SessionOrderHeaps())
        heapq.heappush(order.sched, (-(s.last + s.expect), s.version, s.name))
        heapq.heappush(order.trans, (s.last + s.expect, s.version, s.name))
        self._entries += 2
        if self._entries > 4 * len(self.sessions) + self.slack:
            self.compact()

    def compact(self) -> None:
        """Drop every stale entry (those of sessions hinted again or forgotten)."""
        def current(e: _Entry) -> bool:
            t = self.sessions.get(e[2])
            return t is not None and t.version == e[1]

        self._entries = 0
        for order in self.orders.values():
            for heap in (order.sched, order.trans, order.overdue):
                heap[:] = [e for e in heap if current(e)]
                heapq.heapify(heap)
                self._entries += len(heap)

    def victims(self, now: float, level_of: Callable[[int], int],
                inner_pred: float) -> Generator[Session | None, None, None]:
        """Sessions from the first to leave on, by level (``level_of`` a priority) then by
        prediction; None where the unhinted blocks' turn comes (level 0, predicted back at
        ``inner_pred``). The sessions it takes off the heaps go back when it is closed."""
        levels: dict[int, list[SessionOrderHeaps]] = {}
        for priority in sorted(self.orders):
            levels.setdefault(level_of(priority), []).append(self.orders[priority])
        levels.setdefault(0, [])
        taken: list[tuple[list[_Entry], _Entry]] = []
        try:
            for level in sorted(levels):
                orders = levels[level]
                for order in orders:
                    self._turn_overdue(order, now)
                inner_due = level == 0
                while True:
                    best: tuple[float, list[_Entry]] | None = None
                    for order in orders:
                        sched = self._top(order.sched)
                        if sched is not None and (best is None or -sched[0] > best[0]):
                            best = (-sched[0], order.sched)
                        late = self._top(order.overdue)
                        if late is not None:
                            p = now + self.alpha * (now - late[0])
                            if best is None or p > best[0]:
                                best = (p, order.overdue)
                    if inner_due and (best is None or inner_pred > best[0]):
                        inner_due = False
                        yield None
                        continue
                    if best is None:
                        break
                    entry = heapq.heappop(best[1])
                    taken.append((best[1], entry))
                    yield self.sessions[entry[2]]
        finally:
            for heap, entry in taken:
                heapq.heappush(heap, entry)

    def _top(self, heap: list[_Entry]) -> _Entry | None:
        while heap:
            _key, version, name = heap[0]
            s = self.sessions.get(name)
            if s is not None and s.version == version:
                if s.blocks > 0:
                    return heap[0]
                s.queued = False
            heapq.heappop(heap)
            self._entries -= 1
        return None

    def _turn_overdue(self, order: SessionOrderHeaps, now: float) -> None:
        while order.trans and order.trans[0][0] <= now:
            _, version, name = heapq.heappop(order.trans)
            s = self.sessions.get(name)
            if s is not None and s.version == version:
                s.version = self.next_version()
                heapq.heappush(order.overdue, (s.last + s.expect, s.version, name))
            else:
                self._entries -= 1
