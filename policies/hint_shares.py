"""HintShares: how much of the tier hints may claim, and whether they count now.

A lease keeps a session's blocks, and a raised priority puts them ahead of others', only
while all leased (raised) blocks fit their share of the tier: past it, leases are not
honoured and raised priorities count as normal ones, so no client's hints can starve the cache.
This is the bookkeeping of those two shares: blocks counted in each, lease ends in time order.
"""

from __future__ import annotations

import heapq

from .session_order import Session


class HintShares:
    def __init__(self, lease_budget: int, priority_budget: int) -> None:
        self.lease_budget = lease_budget
        self.priority_budget = priority_budget
        #: Blocks of sessions holding a live lease, and of sessions of raised priority (> 0).
        self.leased_blocks = 0
        self.raised_blocks = 0
        #: (lease end, lease sequence number, session): when each lease's blocks stop counting.
        self._lease_ends: list[tuple[float, int, Session]] = []

    def add_blocks(self, s: Session, delta: int) -> None:
        """``s`` holds ``delta`` more blocks."""
        s.blocks += delta
        self.count(s, delta)

    def count(self, s: Session, blocks: int) -> None:
        """Add ``blocks`` of ``s`` (negative: take them back) to the shares ``s`` is in."""
        if s.lease_live:
            self.leased_blocks += blocks
        if s.priority > 0:
            self.raised_blocks += blocks

    def lease(self, s: Session, seq: int, sessions: int, slack: int) -> None:
        """``s``'s new lease (its ``lease_until``, numbered ``seq``) counts until it ends; the
        ends of replaced leases are dropped once they outnumber the ``sessions`` by ``slack``."""
        assert s.lease_until is not None
        s.lease_seq = seq
        heapq.heappush(self._lease_ends, (s.lease_until, seq, s))
        if len(self._lease_ends) > 2 * sessions + slack:
            self.compact()

    def expire(self, now: float) -> None:
        """Leases that ended stop counting in the lease share (each once, in end order)."""
        ends = self._lease_ends
        while ends and ends[0][0] <= now:
            _, seq, s = heapq.heappop(ends)
            if s.lease_seq == seq and s.lease_live:
                self.leased_blocks -= s.blocks
                s.lease_live = False

    def compact(self) -> None:
        """Drop the lease ends of leases replaced or forgotten (a session leased again and again
        leaves one entry per hint until its end, which may be a day away)."""
        self._lease_ends = [e for e in self._lease_ends if e[2].lease_live and e[2].lease_seq == e[1]]
        heapq.heapify(self._lease_ends)

    @staticmethod
    def holds_lease(s: Session, now: float) -> bool:
        return s.lease_live and s.lease_until is not None and s.lease_until > now

    def leases_honoured(self, now: float) -> bool:
        """Leases keep their blocks only while all leased blocks fit the lease share."""
        self.expire(now)
        return self.leased_blocks <= self.lease_budget

    def raised_honoured(self, incoming: int = 0) -> bool:
        """Raised priorities count while their blocks (and ``incoming`` more) fit their share."""
        return self.raised_blocks + incoming <= self.priority_budget

    @staticmethod
    def level(priority: int, raised: bool) -> int:
        """The eviction level a priority counts at: raised ones only while within their share."""
        return priority if priority <= 0 or raised else 0
