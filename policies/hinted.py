"""Hinted: evict the blocks of the session expected back last, from what callers know.

A policy that learns from block sightings alone cannot tell an agent that will be back in ten
seconds (its request ended in a tool call) from one that ended its turn: both look like a
context last used a moment ago. Callers know (``RequestHint``: session, expected return,
priority, lease); this policy orders sessions by their *predicted next use* and evicts the
latest, Belady's rule with predictions in place of the future:

* A session's prediction is ``due = last + expect`` until then, and ``now + overdue_factor *
  (now - due)`` once it is late: ``last`` is when its last request was hinted, ``expect`` the
  return it announced (``unknown_return_s`` where it announced none, e.g. a turn that ended).
  A late session is predicted further off the longer it stays away (a heavy-tailed return
  time: the longer the wait so far, the longer the wait to come); an exact announcement keeps
  its exact place.
* A session's blocks leave blocks of its earlier requests first (a rewritten context), then its
  deepest blocks (a prefix hit needs the head).
* A request whose own session is the one predicted back last stores nothing that would evict
  someone else's blocks (``admitted``): under a load larger than the tier, the sessions already
  held keep their place (what MIN does with a loop larger than the cache), instead of LRU's
  thrashing where every session evicts the next one due.
* ``priority``: sessions of a lower priority leave first, whatever their predictions.
* ``lease_s``: a session's blocks stay until the lease ends, as long as leased blocks are at
  most ``lease_share`` of the tier; past that share, leases are not honoured (a hint cannot
  starve the cache) and expired leases fall back to the order above.

Blocks no hint named (no session, or a request without hints) are ordered by an inner policy
(``inner``, a hash-level policy by name, default ``prefix_value``) and compete as a session
expected back in ``unknown_return_s``: without any hint the policy *is* its inner policy.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import OrderedDict
from collections.abc import Collection, Generator, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.policy import CachePolicy, LedgerCachePolicy
from kvoffload.offload.policy_registry import create_policy

logger = logging.getLogger("kvoffload.policies.hinted")


@dataclass(slots=True)
class _Session:
    name: str
    last: float = 0.0
    expect: float = 0.0
    priority: int = 0
    lease_until: float | None = None
    version: int = 0
    #: Its blocks in the tier by prefix position of its last request (deepest last), and the
    #: ones that request did not use (evicted first). Entries go stale when a block leaves.
    chain: list[Hashable] = field(default_factory=list)
    dead: list[Hashable] = field(default_factory=list)
    blocks: int = 0
    #: It has a live entry in its order's heaps (dropped while it held no block).
    queued: bool = False


class _Order:
    """Sessions of one priority by predicted next use (lazy heaps, stale entries skipped)."""

    def __init__(self) -> None:
        self.sched: list[tuple[float, int, str]] = []  # (-(last + expect), version, name)
        self.trans: list[tuple[float, int, str]] = []  # (time it turns overdue, version, name)
        self.overdue: list[tuple[float, int, str]] = []  # (when it was due, version, name): longest late first


class HintedCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int, inner: str = "prefix_value", unknown_return_s: float = 100.0,
                 overdue_factor: float = 0.3, lease_share: float = 0.25) -> None:
        super().__init__(cache_capacity)
        if not unknown_return_s > 0:
            raise ValueError(f"unknown_return_s={unknown_return_s}: seconds > 0, e.g. 100")
        if not overdue_factor > 0:
            raise ValueError(f"overdue_factor={overdue_factor}: > 0, e.g. 0.3")
        if not 0 <= lease_share < 1:
            raise ValueError(f"lease_share={lease_share}: a share of the tier in [0, 1), e.g. 0.25")
        made = create_policy(inner, cache_capacity)
        if isinstance(made, LedgerCachePolicy):
            raise ValueError(f"inner={inner!r} keeps its state in the tier's ledger; give a hash-level policy "
                             "(prefix_value, s3fifo, sieve, lfu, arc_classic)")
        self.inner = made
        self.unknown_return_s = unknown_return_s
        self.alpha = overdue_factor
        self.lease_budget = int(lease_share * cache_capacity)
        self.now = 0.0
        self.sessions: dict[str, _Session] = {}
        self.owner: dict[Hashable, _Session] = {}
        self.status: dict[Hashable, BlockStatus] = {}
        #: Hinted hashes not in the tier yet (their store comes after the hint), bounded.
        self.pending: OrderedDict[Hashable, _Session] = OrderedDict()
        self.orders: dict[int, _Order] = {}
        self.leased: set[str] = set()
        #: Heap entries carry a version unique over all sessions (a session forgotten and hinted
        #: again must not match its old entries).
        self._versions = itertools.count(1)
        #: Sessions are swept when more than twice those holding blocks, plus this many.
        self.sweep_slack = 64
        self._sweep_at = self.sweep_slack
        #: Blocks the inner policy holds (it is told every insert and removal).
        self._inner_n = 0

    # ---- hints ----------------------------------------------------------------------------
    def hint(self, block_hashes: Sequence[Hashable], hint: BlockHint) -> None:
        self.now = max(self.now, hint.now)
        name = hint.session if hint.session is not None else f"\0request:{block_hashes[-1] if block_hashes else ''}"
        s = self.sessions.get(name)
        if s is None:
            if len(self.sessions) >= self._sweep_at:
                self._sweep()
            s = self.sessions[name] = _Session(name)
        s.last = hint.now
        s.expect = hint.return_at - hint.now if hint.return_at is not None else self.unknown_return_s
        s.priority = hint.priority
        s.lease_until = hint.lease_until
        if s.lease_until is not None and s.lease_until > self.now:
            self.leased.add(name)
        else:
            self.leased.discard(name)
        chain = set(block_hashes)
        s.dead.extend(h for h in s.chain if h not in chain and self.owner.get(h) is s)
        s.chain = []
        for h in block_hashes:
            owner = self.owner.get(h)
            block = self.inner.get(h) if owner is None else None
            if block is not None:  # an unhinted block: now this session's
                self.inner.remove(h)
                self._inner_n -= 1
                self.status[h] = block
                owner = self._own(h, s)
            elif owner is not None and owner is not s:  # shared with another session: the latest user
                owner.blocks -= 1
                owner = self._own(h, s)
            if owner is s:
                s.chain.append(h)
            else:
                self.pending[h] = s
                self.pending.move_to_end(h)
        while len(self.pending) > 4 * self.cache_capacity:
            self.pending.popitem(last=False)
        self._push(s)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("kvoffload: hinted policy: session %s back in %.1f s, priority %d, lease %s; %d of its "
                         "blocks held, %d sessions", name.replace("\0", ""), s.expect, s.priority,
                         "none" if s.lease_until is None else f"{s.lease_until - hint.now:.0f} s", s.blocks,
                         len(self.sessions))

    def _own(self, h: Hashable, s: _Session) -> _Session:
        self.owner[h] = s
        s.blocks += 1
        if not s.queued:  # its entry was dropped while it held nothing: a victim again
            self._push(s)
        return s

    def _sweep(self) -> None:
        """Forget the sessions that hold no block, await no store and hold no live lease, and
        the heap entries gone stale: a server meets sessions without end, and each new one
        would otherwise stay (``_worse_blocks`` walks them all)."""
        awaited = {id(s) for s in self.pending.values()}
        for name, s in list(self.sessions.items()):
            if s.blocks > 0 or id(s) in awaited or (name in self.leased and self._holds_lease(s)):
                continue
            del self.sessions[name]
            self.leased.discard(name)
        for order in self.orders.values():
            for heap in (order.sched, order.trans, order.overdue):
                heap[:] = [e for e in heap if (t := self.sessions.get(e[2])) is not None and t.version == e[1]]
                heapq.heapify(heap)
        self._sweep_at = 2 * len(self.sessions) + self.sweep_slack

    def _push(self, s: _Session) -> None:
        s.version = next(self._versions)
        s.queued = True
        order = self.orders.setdefault(s.priority, _Order())
        heapq.heappush(order.sched, (-(s.last + s.expect), s.version, s.name))
        heapq.heappush(order.trans, (s.last + s.expect, s.version, s.name))

    def predicted(self, s: _Session) -> float:
        """When ``s`` is expected back, on the hints' clock."""
        due = s.last + s.expect
        return due if self.now <= due else self.now + self.alpha * (self.now - due)

    # ---- the CachePolicy contract ---------------------------------------------------------
    def get(self, h: Hashable) -> BlockStatus | None:
        block = self.status.get(h)
        return block if block is not None else self.inner.get(h)

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        s = self.pending.pop(h, None)
        if s is None or self.sessions.get(s.name) is not s:
            self.inner.insert(h, block)
            self._inner_n += 1
            return
        self.status[h] = block
        self._own(h, s)
        s.chain.append(h)  # stored in prefix order, after the head it extends

    def remove(self, h: Hashable) -> None:
        s = self.owner.pop(h, None)
        if s is None:
            if self.inner.get(h) is not None:
                self.inner.remove(h)
                self._inner_n -= 1
            return
        del self.status[h]
        s.blocks -= 1

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        self.inner.touch(block_hashes)

    def refresh(self, block_hashes: Iterable[Hashable]) -> None:
        self.inner.refresh(block_hashes)

    def _held(self) -> int:
        return len(self.status) + self._inner_n

    def admitted(self, block_hashes: list[Hashable]) -> list[Hashable]:
        free = self.cache_capacity - self._held()
        if free >= len(block_hashes):
            return block_hashes
        out: list[Hashable] = []
        plain: list[Hashable] = []
        hinted: list[Hashable] = []
        for h in block_hashes:
            (plain if self.pending.get(h) is None else hinted).append(h)
        if plain:
            out = self.inner.admitted(plain) if free <= 0 else plain
        if hinted:
            s = self.pending[hinted[0]]
            room = max(free, 0) + self._worse_blocks(s)
            out += hinted[:room]
        keep = set(out)
        return [h for h in block_hashes if h in keep]

    def _worse_blocks(self, s: _Session) -> int:
        """Blocks of sessions (and unhinted blocks) that would leave before ``s``'s."""
        mine = self.predicted(s)
        honoured = self._leases_honoured()
        n = 0
        for other in self.sessions.values():
            if other is s or other.blocks <= 0 or (honoured and self._holds_lease(other)):
                continue
            if other.priority < s.priority or (other.priority == s.priority and self.predicted(other) > mine):
                n += other.blocks
        if s.priority > 0 or (s.priority == 0 and self.now + self.unknown_return_s > mine):
            n += self._inner_n
        return n

    def _holds_lease(self, s: _Session) -> bool:
        return s.lease_until is not None and s.lease_until > self.now

    def _leases_honoured(self) -> bool:
        """Leases keep their blocks only while all leased blocks fit ``lease_share`` (expired
        leases are forgotten on the way); asked once per admission or eviction."""
        total = 0
        for name in list(self.leased):
            s = self.sessions[name]
            if self._holds_lease(s):
                total += s.blocks
            else:
                self.leased.discard(name)
        return total <= self.lease_budget

    def _victim_sessions(self) -> Generator[_Session | None, None, None]:
        """Sessions from the first to leave on; None where the unhinted blocks' turn comes."""
        inner_pred = self.now + self.unknown_return_s
        inner_done = False
        for priority in sorted(self.orders):
            order = self.orders[priority]
            self._turn_overdue(order)
            taken: list[tuple[list[tuple[float, int, str]], tuple[float, int, str]]] = []
            try:
                while True:
                    sched = self._top(order.sched)
                    late = self._top(order.overdue)
                    best: tuple[float, list[tuple[float, int, str]]] | None = None
                    if sched is not None:
                        best = (-sched[0], order.sched)
                    if late is not None:
                        p = self.now + self.alpha * (self.now - late[0])
                        if best is None or p > best[0]:
                            best = (p, order.overdue)
                    if priority >= 0 and not inner_done and (best is None or inner_pred > best[0]):
                        inner_done = True
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
        if not inner_done:
            yield None

    def _top(self, heap: list[tuple[float, int, str]]) -> tuple[float, int, str] | None:
        while heap:
            _key, version, name = heap[0]
            s = self.sessions.get(name)
            if s is not None and s.version == version:
                if s.blocks > 0:
                    return heap[0]
                s.queued = False
            heapq.heappop(heap)
        return None

    def _turn_overdue(self, order: _Order) -> None:
        while order.trans and order.trans[0][0] <= self.now:
            _, version, name = heapq.heappop(order.trans)
            s = self.sessions.get(name)
            if s is not None and s.version == version:
                s.version = next(self._versions)
                heapq.heappush(order.overdue, (s.last + s.expect, s.version, name))

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if n <= 0:
            return []
        out: list[tuple[Hashable, BlockStatus]] = []
        chosen: set[Hashable] = set()
        inner_out: list[tuple[Hashable, BlockStatus]] | None = None
        honoured = self._leases_honoured()
        sessions = self._victim_sessions()
        for s in sessions:
            if len(out) >= n:
                break
            if s is None:
                inner_out = self._evict_inner(n - len(out), protected)
                out += inner_out
                continue
            if honoured and self._holds_lease(s):
                continue
            for h in self._candidates(s):
                if len(out) >= n:
                    break
                block = self.status.get(h)
                if block is None or self.owner.get(h) is not s or h in chosen or h in protected or block.ref_cnt != 0:
                    continue
                chosen.add(h)
                out.append((h, block))
        sessions.close()  # the sessions it took off its heaps go back
        if len(out) < n:
            for h, block in inner_out or ():
                self.inner.insert(h, block)  # change nothing
            self._inner_n += len(inner_out or ())
            return None
        for h, _ in out:
            if h in chosen:
                owner = self.owner.pop(h)
                del self.status[h]
                owner.blocks -= 1
        return out

    def _candidates(self, s: _Session) -> Iterator[Hashable]:
        """Its blocks from the first to leave: dead ones, then the chain's deepest (stale
        entries at the tails are dropped on the way; the lists are rebuilt when mostly stale)."""
        for stack in (s.dead, s.chain):
            while stack and self.owner.get(stack[-1]) is not s:
                stack.pop()
            if len(stack) > 2 * s.blocks + 16:
                stack[:] = [h for h in stack if self.owner.get(h) is s]
            yield from reversed(stack)

    def _evict_inner(self, want: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]]:
        """``want`` of the unhinted blocks (all the inner policy holds, if fewer), or none: the
        inner policy's evict is all or nothing, and asking it again for fewer would change its
        state where this call ends up changing nothing."""
        k = min(want, self._inner_n)
        got = self.inner.evict(k, protected) if k > 0 else None
        if got is None:
            return []
        self._inner_n -= len(got)
        return got
