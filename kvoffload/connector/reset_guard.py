"""ResetGuard: after the offload cache is reset, store nothing computed from KV older than it.

A reset (the weights changed in place) gives the offload keys a new salt. The engine resets
its device prefix cache in the same call, but that can fail (vLLM refuses while requests hold
blocks) and the connector is not told: device blocks computed with the old weights then stay
in the prefix cache, a new request hits them, and its blocks, and every block it computes on
top of them, would be stored under the new salt as if fresh.

So after a reset the guard follows device blocks: a block is *fresh* once a request that read
nothing older than the reset fills it (computes or loads it). A request whose local prefix hit
includes a block that is not fresh is *tainted*: it stores nothing, and the blocks it fills are
not fresh either (a later hit on them taints that request too). A block handed to a tainted
request stops being fresh. Requests tracked at the reset are tainted. Before any reset the
guard does nothing. Errs towards storing less: a block it did not see filled is not fresh.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.connector.group_keys import NULL_BLOCK_ID


class ResetGuard:
    def __init__(self) -> None:
        self.active = False
        self._fresh: set[int] = set()
        self._tainted: set[str] = set()

    def reset(self, tracked: Iterable[str]) -> None:
        """A new epoch: no device block is fresh, every request already tracked is tainted."""
        self.active = True
        self._fresh = set()
        self._tainted = set(tracked)

    def admit(self, rid: str, block_ids: list[list[int]], num_local_blocks: int) -> bool:
        """A request allocated its blocks (per group; the first ``num_local_blocks`` engine
        blocks of each are local prefix hits): True when it is tainted."""
        if not self.active:
            return False
        hits = {b for ids in block_ids for b in ids[:num_local_blocks] if b != NULL_BLOCK_ID}
        tainted = rid in self._tainted or not hits <= self._fresh
        if tainted:
            self._tainted.add(rid)
        self.filled(rid, (b for ids in block_ids for b in ids[num_local_blocks:]))
        return tainted

    def filled(self, rid: str, block_ids: Iterable[int]) -> None:
        """Blocks ``rid`` computes or loads into (new blocks of a running request too)."""
        if not self.active:
            return
        ids = {b for b in block_ids if b != NULL_BLOCK_ID}
        if rid in self._tainted:
            self._fresh -= ids
        else:
            self._fresh |= ids

    def tainted(self, rid: str) -> bool:
        return rid in self._tainted

    def forget(self, rid: str) -> None:
        self._tainted.discard(rid)
