"""The engine's free queue of device blocks, as a plan replays it: an LRU whose blocks without a
hash (a reply's unfilled tail, reply blocks no later prompt shows) are kept as runs.

Such a block is never looked up; all it does is take a place in the queue. A request that may
generate ten million tokens takes 625,000 of them: kept one by one (as a ledger keeps blocks)
they cost minutes and gigabytes for a 72 KB log, kept as one run with a count they cost one
entry. Everything else is the ledger's LRU exactly: a hit's blocks move to the recent end, the
request's new blocks evict from the old end (never its own blocks), and its blocks end in the
queue with its first block the most recent and its unfilled run the least.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class _Run:
    """A run of blocks without a hash (identity is the key)."""

    __slots__ = ()


class DeviceQueue:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: Least recent first: a block's hash -> 1, a run -> its length.
        self.queue: OrderedDict[Hashable, int] = OrderedDict()
        self.used = 0

    def lookup(self, blocks: Sequence[Hashable]) -> int:
        """The leading blocks held."""
        n = 0
        for b in blocks:
            if b not in self.queue:
                break
            n += 1
        return n

    def touch(self, blocks: Sequence[Hashable]) -> None:
        """A use of each block held, the first ending the most recent."""
        q = self.queue
        for b in reversed(blocks):
            if b in q:
                q.move_to_end(b)

    def run(self, blocks: Sequence[Hashable], unfilled: int) -> None:
        """A request's blocks (``blocks``, prefix order, then ``unfilled`` without a hash) taken
        from the queue's old end and given back to its recent end, the first block last."""
        q = self.queue
        unfilled = max(0, unfilled)
        own = set(blocks)
        new = [b for b in dict.fromkeys(blocks) if b not in q]
        need = len(new) + unfilled - (self.capacity - self.used)
        kept: list[tuple[Hashable, int]] = []  # the request's own blocks met at the old end
        while need > 0 and q:
            key, size = q.popitem(last=False)
            if key in own:
                kept.append((key, size))
                continue
            if size > need:  # part of a run
                q[key] = size - need
                q.move_to_end(key, last=False)
                self.used -= need
                break
            self.used -= size
            need -= size
        for key, size in reversed(kept):
            q[key] = size
            q.move_to_end(key, last=False)
        for b in new:
            q[b] = 1
        self.used += len(new)
        if unfilled > 0:
            q[_Run()] = unfilled
            self.used += unfilled
        for b in reversed(blocks):
            q.move_to_end(b)
