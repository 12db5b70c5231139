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
from kvoffload.connector.scheduler.request_state import RequestOffloadState


class ResetGuard:
    """The device blocks filled since the last reset; whether a request is tainted is its
    record's ``stale_kv``."""

    def __init__(self) -> None:
        self.active = False
        self._fresh: set[int] = set()

    def reset(self, tracked: Iterable[RequestOffloadState]) -> None:
        """A new epoch: no device block is fresh, every request already allocated is tainted."""
        self.active = True
        self._fresh = set()
        for state in tracked:
            if state.allocated:
                state.stale_kv = True

    def admit(self, state: RequestOffloadState, block_ids: list[list[int]], num_local_blocks: int) -> bool:
        """A request allocated its blocks (per group; the first ``num_local_blocks`` engine
        blocks of each are local prefix hits): True when it is tainted."""
        if not self.active:
            return False
        hits = {b for ids in block_ids for b in ids[:num_local_blocks] if b != NULL_BLOCK_ID}
        if not hits <= self._fresh:
            state.stale_kv = True
        self.filled(state, (b for ids in block_ids for b in ids[num_local_blocks:]))
        return state.stale_kv

    def filled(self, state: RequestOffloadState | None, block_ids: Iterable[int]) -> None:
        """Blocks a request (``state``; None: one not tracked) computes or loads into (new blocks
        of a running request too)."""
        if not self.active:
            return
        ids = {b for b in block_ids if b != NULL_BLOCK_ID}
        if state is not None and state.stale_kv:
            self._fresh -= ids
        else:
            self._fresh |= ids
