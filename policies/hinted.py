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
  deepest blocks (a prefix hit needs the head). A block its latest request uses again is live.
* A request whose own session is the one predicted back last stores nothing that would evict
  someone else's blocks (``admitted``): under a load larger than the tier, the sessions already
  held keep their place (what MIN does with a loop larger than the cache), instead of LRU's
  thrashing where every session evicts the next one due.
* ``priority``: sessions of a lower priority leave first, whatever their predictions. A
  negative priority (a caller lowering its own blocks) always counts; a raised one only while
  the blocks of raised sessions are at most ``priority_share`` of the tier: past that share,
  raised priorities count as normal ones (a flood of raised one-off prompts cannot take the
  tier). Which clients may raise it at all is the operator's ``hints.max_priority``. A block
  shared by two tenants' sessions moves only to one that stands no lower (``tenant_claims``).
* ``lease_s``: a session's blocks stay until the lease ends, as long as leased blocks are at
  most ``lease_share`` of the tier; past that share, leases are not honoured (a hint cannot
  starve the cache) and expired leases fall back to the order above.

Blocks no hint named (no session, or a request without hints) are ordered by an inner policy
(``inner``, a hash-level policy by name, default ``prefix_value``) and compete as a normal
session expected back in ``unknown_return_s``: without any hint the policy *is* its inner policy.

Bounds, whatever clients send: a session holding no block and awaiting no store is forgotten
(a lease on nothing pins nothing): at most ``max_sessions()`` are tracked; heaps are compacted
as they fill with stale entries; an eviction or admission walks sessions only as far as it needs.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Collection, Generator, Hashable, Iterable, Iterator, Sequence

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.policy import CachePolicy, LedgerCachePolicy
from kvoffload.offload.policy_registry import create_policy

from .hint_shares import HintShares
from .session_order import Session, SessionOrder, SessionOrderHeaps, session_label
from .tenant_claims import TenantClaims

logger = logging.getLogger("kvoffload.policies.hinted")

class HintedCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int, inner: str = "prefix_value", unknown_return_s: float = 100.0,
                 overdue_factor: float = 0.3, lease_share: float = 0.25, priority_share: float = 0.5) -> None:
        super().__init__(cache_capacity)
        share = "a share of the tier in [0, 1), e.g."
        for key, value, ok, fix in (("unknown_return_s", unknown_return_s, unknown_return_s > 0, "seconds > 0, e.g. 100"),
                                    ("overdue_factor", overdue_factor, overdue_factor > 0, "> 0, e.g. 0.3"),
                                    ("lease_share", lease_share, 0 <= lease_share < 1, f"{share} 0.25"),
                                    ("priority_share", priority_share, 0 <= priority_share < 1, f"{share} 0.5")):
            if not ok:
                raise ValueError(f"{key}={value}: {fix}")
        made = create_policy(inner, cache_capacity)
        if isinstance(made, LedgerCachePolicy):
            raise ValueError(f"inner={inner!r} keeps its state in the tier's ledger; give a hash-level policy "
                             "(prefix_value, s3fifo, sieve, lfu, arc_classic)")
        self.inner = made
        self.unknown_return_s = unknown_return_s
        self.shares = HintShares(int(lease_share * cache_capacity), int(priority_share * cache_capacity))
        self.now = 0.0
        self.sessions: dict[Hashable, Session] = {}
        self.owner: dict[Hashable, Session] = {}
        self.claims = TenantClaims()
        self.status: dict[Hashable, BlockStatus] = {}
        #: Hinted hashes not in the tier yet (their store comes after the hint), bounded.
        self.pending: OrderedDict[Hashable, Session] = OrderedDict()
        self.pending_cap = 2 * cache_capacity
        #: Sessions by predicted next use, per priority.
        self.order = SessionOrder(self.sessions, overdue_factor)
        #: Sessions are swept when more than twice those holding blocks, plus this many.
        self.sweep_slack = 64
        self._sweep_at = self.sweep_slack
        #: Blocks the inner policy holds (it is told every insert and removal).
        self._inner_n = 0

    def max_sessions(self) -> int:
        """The most sessions ever tracked: twice those that hold a block or await a store
        (at most the capacity plus the pending bound), plus the sweep's slack."""
        return 2 * (self.cache_capacity + self.pending_cap) + self.sweep_slack

    # ---- hints ----------------------------------------------------------------------------
    def hint(self, block_hashes: Sequence[Hashable], hint: BlockHint) -> None:
        self.now = max(self.now, hint.now)
        self.shares.expire(self.now)
        name: Hashable = hint.session if hint.session is not None else \
            ("\0request", block_hashes[-1] if block_hashes else None)
        s = self.sessions.get(name)
        if s is None:
            if len(self.sessions) >= self._sweep_at:
                self._sweep()
            s = self.sessions[name] = Session(name, tenant=hint.tenant)
        self.shares.count(s, -s.blocks)
        s.last = hint.now
        s.expect = hint.return_at - hint.now if hint.return_at is not None else self.unknown_return_s
        s.priority = hint.priority
        s.lease_until = hint.lease_until
        s.lease_live = s.lease_until is not None and s.lease_until > self.now
        if s.lease_live:
            self.shares.lease(s, self.order.next_version(), len(self.sessions), self.sweep_slack)
        self.shares.count(s, s.blocks)
        chain = set(block_hashes)
        s.dead = [h for h in (*s.dead, *s.chain) if h not in chain and self.owner.get(h) is s]
        s.chain = []
        s.live = chain
        for h in block_hashes:
            owner = self.owner.get(h)
            block = self.inner.get(h) if owner is None else None
            if block is not None:  # an unhinted block: now this session's
                self.inner.remove(h)
                self._inner_n -= 1
                self.status[h] = block
                owner = self._own(h, s)
            elif owner is not None and owner is not s:  # shared with another session: the latest user
                if not self.claims.may_take(h, s, owner, self._standing):
                    continue  # another tenant's block: a hint may raise its standing, never lower it
                self.shares.add_blocks(owner, -1)
                owner = self._own(h, s)
            if owner is s:
                s.chain.append(h)
            else:
                self.pending[h] = s
                self.pending.move_to_end(h)
        while len(self.pending) > self.pending_cap:
            self.pending.popitem(last=False)
        for h, prev in self.claims.given_back(s, self.owner, self.sessions, self._standing) if s.adopted else ():
            self.shares.add_blocks(s, -1)
            self._own(h, prev)
            if h not in prev.live:
                prev.dead.append(h)
        self.order.push(s)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("kvoffload: hinted policy: session %s back in %.1f s, priority %d, lease %s; %d of its "
                         "blocks held, %d sessions", session_label(name), s.expect, s.priority,
                         "none" if s.lease_until is None else f"{s.lease_until - hint.now:.0f} s", s.blocks,
                         len(self.sessions))

    def _standing(self, s: Session) -> tuple[float, ...]:
        """The eviction order's own comparison, larger staying longer: a live lease's end, then
        the priority level, then the predicted return (sooner stays)."""
        lease = s.lease_until if self.shares.holds_lease(s, self.now) and s.lease_until is not None else -math.inf
        return lease, self.shares.level(s.priority, self.shares.raised_honoured()), -self.predicted(s)

    def _own(self, h: Hashable, s: Session) -> Session:
        self.owner[h] = s
        self.shares.add_blocks(s, 1)
        if not s.queued:  # its entry was dropped while it held nothing: a victim again
            self.order.push(s)
        return s

    def _sweep(self) -> None:
        """Forget the sessions that hold no block and await no store (a lease on nothing pins
        nothing), and the heap entries gone stale: a server meets sessions without end, and a
        client can invent them."""
        awaited = {id(s) for s in self.pending.values()}
        for name, s in list(self.sessions.items()):
            if s.blocks <= 0 and id(s) not in awaited:
                del self.sessions[name]
                s.lease_live = False
        self.order.compact()
        self.shares.compact()
        self._sweep_at = 2 * len(self.sessions) + self.sweep_slack

    @property
    def orders(self) -> dict[int, SessionOrderHeaps]:
        return self.order.orders

    def predicted(self, s: Session) -> float:
        """When ``s`` is expected back, on the hints' clock."""
        return self.order.predicted(s, self.now)

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
        if h in s.live:
            s.chain.append(h)  # stored in prefix order, after the head it extends
        else:
            s.dead.append(h)  # hinted by an earlier request of the session, stored late

    def remove(self, h: Hashable) -> None:
        s = self.owner.pop(h, None)
        self.claims.forget(h, s)
        if s is None:
            if self.inner.get(h) is not None:
                self.inner.remove(h)
                self._inner_n -= 1
            return
        del self.status[h]
        self.shares.add_blocks(s, -1)

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
            need = len(hinted) - max(free, 0)
            room = max(free, 0) + self._worse_blocks(s, need, len(hinted))
            out += hinted[:room]
        keep = set(out)
        return [h for h in block_hashes if h in keep]

    # ---- eviction order -------------------------------------------------------------------
    def _worse_blocks(self, s: Session, need: int, incoming: int) -> int:
        """Blocks of sessions (and unhinted blocks) that would leave before ``s``'s, counted in
        eviction order until ``need`` are found (or the order reaches ``s``). ``s``'s raised
        priority counts only if its ``incoming`` blocks stay within the share."""
        shares = self.shares
        raised = shares.raised_honoured()
        honoured = shares.leases_honoured(self.now)
        mine = (shares.level(s.priority, s.priority > 0 and shares.raised_honoured(incoming)), self.predicted(s))
        inner = (0, self.now + self.unknown_return_s)
        n = 0
        walk = self._victim_sessions()
        try:
            for other in walk:
                if n >= need:
                    break
                if other is None:
                    if inner[0] < mine[0] or (inner[0] == mine[0] and inner[1] > mine[1]):
                        n += self._inner_n
                        continue
                    break
                if other is s:
                    break
                if honoured and shares.holds_lease(other, self.now):
                    continue
                level = shares.level(other.priority, raised)
                if level < mine[0] or (level == mine[0] and self.predicted(other) > mine[1]):
                    n += other.blocks
                else:
                    break
        finally:
            walk.close()  # the sessions it took off its heaps go back
        return n

    def _victim_sessions(self) -> Generator[Session | None, None, None]:
        """Sessions from the first to leave on; None where the unhinted blocks' turn comes.
        Levels go up from the lowest priority; raised priorities share the normal level while
        they are past their share."""
        raised = self.shares.raised_honoured()
        return self.order.victims(self.now, lambda priority: HintShares.level(priority, raised),
                                  self.now + self.unknown_return_s)

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if n <= 0:
            return []
        out: list[tuple[Hashable, BlockStatus]] = []
        chosen: set[Hashable] = set()
        inner_out: list[tuple[Hashable, BlockStatus]] | None = None
        honoured = self.shares.leases_honoured(self.now)
        sessions = self._victim_sessions()
        for s in sessions:
            if len(out) >= n:
                break
            if s is None:
                inner_out = self._evict_inner(n - len(out), protected)
                out += inner_out
                continue
            if honoured and self.shares.holds_lease(s, self.now):
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
                self.shares.add_blocks(owner, -1)
                self.claims.forget(h, owner)
        return out

    def _candidates(self, s: Session) -> Iterator[Hashable]:
        """Its blocks from the first to leave: dead ones (not back in the live chain), then the
        chain's deepest (stale entries at the tails are dropped on the way; the lists are
        rebuilt when mostly stale)."""
        for stack, dead in ((s.dead, True), (s.chain, False)):
            while stack and (self.owner.get(stack[-1]) is not s or (dead and stack[-1] in s.live)):
                stack.pop()
            if len(stack) > 2 * s.blocks + 16:
                stack[:] = [h for h in stack if self.owner.get(h) is s and not (dead and h in s.live)]
            for h in reversed(stack):
                if not (dead and h in s.live):
                    yield h

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
