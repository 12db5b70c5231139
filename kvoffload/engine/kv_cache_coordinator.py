"""Coordinates the per-group managers so every group agrees on one prefix-hit length."""

from __future__ import annotations

from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.hashing import BlockHash
from kvoffload.engine.kv_cache_block import KVCacheBlock
from kvoffload.engine.single_type_manager import FullAttentionManager, SingleTypeKVCacheManager, SlidingWindowManager


class KVCacheCoordinator:
    def __init__(self, block_pool: BlockPool, block_size: int, windows: tuple[int | None, ...] = (None,)) -> None:
        """One manager per KV-cache group: ``windows[g]`` is group g's sliding window (None: full)."""
        if not windows:
            raise ValueError("no KV-cache groups: need at least one (windows=(None,) for full attention)")
        self.block_pool = block_pool
        self.block_size = block_size
        self.managers: list[SingleTypeKVCacheManager] = [
            FullAttentionManager(block_pool, block_size, gid) if w is None
            else SlidingWindowManager(block_pool, block_size, gid, w)
            for gid, w in enumerate(windows)
        ]

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Fixed point over groups: shrink the candidate length until every group hits it."""
        length = max_length
        while True:
            per_group = tuple(m.find_longest_cache_hit(block_hashes, length) for m in self.managers)
            agreed = min(len(blocks) for blocks in per_group) * self.block_size
            if agreed == length or all(len(b) * self.block_size == agreed for b in per_group):
                num_blocks = agreed // self.block_size
                return tuple(b[:num_blocks] for b in per_group), agreed
            length = agreed

    def _tokens(self, manager: SingleTypeKVCacheManager, num_tokens: int, sliding_tokens: int | None) -> int:
        return sliding_tokens if sliding_tokens is not None and isinstance(manager, SlidingWindowManager) else num_tokens

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: tuple[list[KVCacheBlock], ...],
        num_computed_tokens: int = 0, sliding_tokens: int | None = None,
    ) -> int:
        """``sliding_tokens``: what sliding-window groups make room for instead (no lookahead:
        they need a window and the next chunk, never the whole rest of a prompt)."""
        return sum(
            m.get_num_blocks_to_allocate(request_id, self._tokens(m, num_tokens, sliding_tokens), new_computed_blocks[i],
                                         num_computed_tokens)
            for i, m in enumerate(self.managers)
        )

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for m in self.managers:
            m.remove_skipped_blocks(request_id, num_computed_tokens)

    def save_new_computed_blocks(
        self, request_id: str, new_computed_blocks: tuple[list[KVCacheBlock], ...]
    ) -> None:
        for i, m in enumerate(self.managers):
            m.save_new_computed_blocks(request_id, new_computed_blocks[i])

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_computed_tokens: int = 0,
                            sliding_tokens: int | None = None) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.allocate_new_blocks(request_id, self._tokens(m, num_tokens, sliding_tokens), num_computed_tokens)
                     for m in self.managers)

    def cache_blocks(self, request_id: str, block_hashes: list[BlockHash], num_tokens: int) -> None:
        for m in self.managers:
            m.cache_blocks(request_id, block_hashes, num_tokens)

    def uncache_from(self, request_id: str, num_tokens: int) -> None:
        for manager in self.managers:
            manager.uncache_from(request_id, num_tokens)

    def free(self, request_id: str) -> None:
        for m in self.managers:
            m.free(request_id)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.managers)
