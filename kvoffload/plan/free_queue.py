"""The device's free blocks in the order the engine reuses them, by position only.

vLLM's block pool (and the bundled engine's) takes a fresh block from the head of its free
queue and puts a freed one at the tail, still holding its cached KV until it is taken. A
request preempted for room frees its blocks last block first, so when it comes back its
prefix survives as far as the blocks taken since have not reached it. The timing replay needs
exactly that answer, and positions are enough to give it: no block ids, no hashes.
"""

from __future__ import annotations

import bisect


class FreeQueue:
    def __init__(self, blocks: int) -> None:
        self.head = 0  # position of the next block taken
        self.tail = blocks  # position the next freed block gets
        self._gaps: list[tuple[int, int]] = []  # [start, end) reclaimed from the middle, sorted

    def take(self, n: int) -> None:
        """``n`` fresh blocks leave from the head (fewer if the queue runs dry)."""
        while n > 0 and self.head < self.tail:
            if self._gaps and self._gaps[0][0] <= self.head:
                self.head = max(self.head, self._gaps.pop(0)[1])
                continue
            end = self._gaps[0][0] if self._gaps else self.tail
            step = min(n, end - self.head)
            self.head += step
            n -= step

    def give(self, n: int) -> int:
        """``n`` freed blocks join the tail; returns the first one's position."""
        first = self.tail
        self.tail += n
        return first

    def survivors(self, first: int, blocks: int, limit: int) -> int:
        """How many leading blocks of a request that gave ``blocks`` at ``first`` (its last
        block first) are still cached, at most ``limit``."""
        return min(max(first + blocks - self.head, 0), blocks, limit)

    def reclaim(self, first: int, blocks: int, kept: int) -> None:
        """Its ``kept`` leading blocks are taken back: they leave from where they are."""
        if kept:
            bisect.insort(self._gaps, (first + blocks - kept, first + blocks))
