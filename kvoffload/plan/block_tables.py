"""The device blocks of the requests the timing replay runs: whose they are, which are shared,
and which freed ones still hold their KV.

vLLM's block pool (and the bundled engine's) gives a request whose prompt starts with blocks a
running request holds those very blocks, one more reference each: twenty conversations on one
system prompt hold it once, not twenty times. A hit on a block nobody holds takes it out of the
free queue where it sits; a fresh block comes from the queue's head, evicting what it held; a
finished or preempted request frees its table last block first, to the tail, and a block
reaches the queue only when its last holder lets go. Keys say which blocks are the same: a
prompt block's is its prefix key, a block past the keys (the reply's, or a prompt given none)
belongs to its request alone. A block computed beside a held copy of itself (two requests on a
new prefix in one step) is a private duplicate, as in the engine.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from kvoffload.plan.free_queue import FreeQueue


class BlockTables:
    def __init__(self, capacity: int, keys: Sequence[Sequence[Hashable]]) -> None:
        self.queue = FreeQueue(capacity)
        self.keys = keys  # per request: its prompt's full blocks' prefix keys, in order
        self.tables: list[list[Hashable | None]] = [[] for _ in keys]  # keyed blocks; None: a private copy
        self.own = [0] * len(keys)  # blocks past the keys: a count, so a long reply costs no list
        self.own_freed = [(0, 0)] * len(keys)  # where a preempted request's own blocks went: (first, count)
        self.refs: dict[Hashable, int] = {}  # key -> requests holding its one block
        self.free_at: dict[Hashable, int] = {}  # key -> its place in the free queue (evicted once passed)
        self.used = 0  # blocks held by anyone

    def held(self, i: int) -> int:
        return len(self.tables[i]) + self.own[i]

    def _cached(self, key: Hashable) -> bool:
        """Held, or freed and not yet evicted (a hit takes it back from the middle of the queue)."""
        return key in self.refs or self.free_at.get(key, -1) >= self.queue.head

    def room(self, i: int, n: int, hits: int) -> int:
        """Blocks that ``n`` more of request ``i``'s (its first ``hits`` found cached) would
        take from the free queue: all but those a running request holds."""
        start, keys = self.held(i), self.keys[i]
        return n - sum(1 for p in range(start, min(start + n, hits, len(keys))) if keys[p] in self.refs)

    def take(self, i: int, n: int, hits: int) -> None:
        table, refs, keys = self.tables[i], self.refs, self.keys[i]
        fresh = 0
        while n and self.own[i] == 0 and len(table) < len(keys):
            p = len(table)
            key = keys[p]
            n -= 1
            if key in refs:
                if p < hits:
                    refs[key] += 1
                    table.append(key)
                    continue
                key = None  # computed again beside the held copy
            elif p < hits and self.free_at.get(key, -1) >= self.queue.head:
                self.queue.reclaim(self.free_at.pop(key), 1, 1)
                refs[key] = 1
                table.append(key)
                self.used += 1
                continue
            else:
                self.free_at.pop(key, None)
                refs[key] = 1
            table.append(key)
            fresh += 1
        if n:  # its own blocks: a preempted request's survivors come back from where they sit
            first, count = self.own_freed[i]  # (0, 0) for a new request: its hits come from the head
            back = min(n, count, max(hits - len(keys) - self.own[i], 0))
            if back:
                self.queue.reclaim(first, count, back)
            self.own_freed[i] = (0, 0)
            self.own[i] += n
            self.used += back
            fresh += n - back
        self.used += fresh
        self.queue.take(fresh)

    def release(self, i: int) -> None:
        """Request ``i`` lets go of its table, last block first: its own blocks, then the keyed."""
        own = self.own[i]
        freed: list[Hashable | None] = []
        for key in reversed(self.tables[i]):
            if key is None:
                freed.append(None)
            elif self.refs[key] > 1:
                self.refs[key] -= 1
            else:
                del self.refs[key]
                freed.append(key)
        first = self.queue.give(own + len(freed))
        self.own_freed[i] = (first, own)
        for j, key in enumerate(freed, start=first + own):
            if key is not None:
                self.free_at[key] = j
        self.used -= own + len(freed)
        self.tables[i] = []
        self.own[i] = 0
        if len(self.free_at) > 4 * (self.queue.tail - self.queue.head) + 4096:  # forget the evicted
            self.free_at = {k: at for k, at in self.free_at.items() if at >= self.queue.head}

    def survivors(self, i: int, limit: int) -> int:
        """Request ``i``'s leading blocks still cached, at most ``limit``: what a preempted
        request finds when it comes back."""
        keys = self.keys[i]
        n = 0
        while n < min(limit, len(keys)) and self._cached(keys[n]):
            n += 1
        if n < len(keys) or n >= limit:
            return n
        first, count = self.own_freed[i]  # its own blocks were freed last one first
        return n + min(max(first + count - self.queue.head, 0), count, limit - n)
