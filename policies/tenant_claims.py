"""Blocks one tenant's session took over from another tenant's, and whose they were.

Where two tenants' prompts share blocks (one prefix, no salt between them), a block belongs to
one session at a time in the hinted policy. A hint may move it to a session that keeps it at
least as long (raising its standing), never to one that would let it leave sooner: a negative
priority or a far-off return moves only the sender's own blocks. A block taken over this way
keeps a claim for the session it came from, and goes back to it once the taker stops using it
or announces worse, so a tenant cannot first take another's blocks with a good hint, then lower
them with a bad one. Entries exist only for blocks in the tier: bounded by the capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

from .session_order import Session

#: A session's standing: a larger one keeps its blocks longer.
Standing = Callable[[Session], tuple[float, ...]]


class TenantClaims:
    def __init__(self) -> None:
        #: Block -> the session of another tenant it was taken from.
        self.displaced: dict[Hashable, Session] = {}

    def may_take(self, h: Hashable, s: Session, owner: Session, standing: Standing) -> bool:
        """Whether ``s`` takes block ``h`` from ``owner`` (another session), the claims moved
        along: across tenants only when ``s`` stands no lower. A claim stays with the session
        the block was first taken from: a relay through a third tenant (D takes from A what A
        took from B, then moves on) used to hand it to A as A's own, which A then lowered."""
        if owner.tenant != s.tenant:
            if standing(s) < standing(owner):
                return False
            first = self.displaced.get(h) if h in owner.adopted else None
            if first is not None and first.tenant == s.tenant:
                del self.displaced[h]  # back with the tenant it was taken from: its claim is settled
            else:
                self.displaced[h] = first if first is not None else owner
                s.adopted.add(h)
        elif h in owner.adopted:  # within a tenant the claim of the tenant it came from goes with it
            s.adopted.add(h)
        owner.adopted.discard(h)
        return True

    def forget(self, h: Hashable, owner: Session | None) -> None:
        """Block ``h`` left the tier."""
        self.displaced.pop(h, None)
        if owner is not None:
            owner.adopted.discard(h)

    def given_back(self, s: Session, owner: Mapping[Hashable, Session], sessions: Mapping[Hashable, Session],
                   standing: Standing) -> list[tuple[Hashable, Session]]:
        """The blocks ``s`` took over that go back now, with the session each goes back to (the
        caller moves them): those ``s`` no longer uses or would let leave sooner, whose session
        is still tracked (a forgotten one's claim lapses)."""
        out = []
        for h in list(s.adopted):
            prev = self.displaced.get(h)
            if owner.get(h) is not s or prev is None or sessions.get(prev.name) is not prev:
                s.adopted.discard(h)
                if owner.get(h) is s:
                    self.displaced.pop(h, None)
                continue
            if h in s.live and standing(s) >= standing(prev):
                continue
            s.adopted.discard(h)
            del self.displaced[h]
            out.append((h, prev))
        return out
