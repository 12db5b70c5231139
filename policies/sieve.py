"""SIEVE (Zhang et al., NSDI'24): one FIFO, a visited bit, and a hand that sweeps from the
oldest block towards the newest, clearing bits and evicting the first unvisited block."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.policy import CachePolicy

from .base import evictable, has_n_evictable


@dataclass(slots=True, eq=False)
class _Node:
    key: Hashable
    block: BlockStatus
    visited: bool = False
    newer: _Node | None = None
    older: _Node | None = None


class SIEVECachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.nodes: dict[Hashable, _Node] = {}
        self.newest: _Node | None = None
        self.oldest: _Node | None = None
        self.hand: _Node | None = None

    def get(self, h: Hashable) -> BlockStatus | None:
        node = self.nodes.get(h)
        return None if node is None else node.block

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        node = _Node(h, block, older=self.newest)
        if self.newest is not None:
            self.newest.newer = node
        self.newest = node
        if self.oldest is None:
            self.oldest = node
        self.nodes[h] = node

    def _unlink(self, node: _Node) -> None:
        if self.hand is node:
            self.hand = node.newer
        if node.older is not None:
            node.older.newer = node.newer
        else:
            self.oldest = node.newer
        if node.newer is not None:
            node.newer.older = node.older
        else:
            self.newest = node.older
        del self.nodes[node.key]

    def remove(self, h: Hashable) -> None:
        node = self.nodes.get(h)
        if node is not None:
            self._unlink(node)

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        for h in block_hashes:
            node = self.nodes.get(h)
            if node is not None:
                node.visited = True

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if not has_n_evictable(((h, nd.block) for h, nd in self.nodes.items()), n, protected):
            return None
        out: list[tuple[Hashable, BlockStatus]] = []
        while len(out) < n:
            node = self.hand or self.oldest
            assert node is not None
            if node.visited or not evictable(node.key, node.block, protected):
                node.visited = False if evictable(node.key, node.block, protected) else node.visited
                self.hand = node.newer  # wraps to the oldest when it runs off the newest end
                continue
            self.hand = node.newer
            self._unlink(node)
            out.append((node.key, node.block))
        return out
