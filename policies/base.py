"""Shared pieces of the research policies: the evictability test and the atomic pre-check."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable

from kvoffload.offload.block_status import BlockStatus


def evictable(h: Hashable, block: BlockStatus, protected: Collection[Hashable]) -> bool:
    return block.ref_cnt == 0 and h not in protected


def has_n_evictable(items: Iterable[tuple[Hashable, BlockStatus]], n: int, protected: Collection[Hashable]) -> bool:
    """Early-exit scan: do at least n evictable blocks exist? (Keeps evict() atomic.)"""
    if n <= 0:
        return True
    found = 0
    for h, block in items:
        if evictable(h, block, protected):
            found += 1
            if found >= n:
                return True
    return False
