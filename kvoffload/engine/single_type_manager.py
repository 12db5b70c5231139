"""Per-KV-cache-group block bookkeeping: which blocks each request holds in one group.

One manager per group, all sharing one BlockPool. Full attention ships now; a sliding-window
manager differs only in ``find_longest_cache_hit`` and in releasing blocks left of the window,
which is why those are the overridable methods.
"""

from __future__ import annotations

from collections import defaultdict

from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.hashing import BlockHash
from kvoffload.engine.kv_cache_block import KVCacheBlock


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager:
    def __init__(self, block_pool: BlockPool, block_size: int, group_id: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.group_id = group_id
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock]
    ) -> int:
        """Blocks the pool must supply: fresh ones plus cached hits that are currently free."""
        num_required = cdiv(num_tokens, self.block_size)
        num_new = num_required - len(new_computed_blocks) - len(self.req_to_blocks[request_id])
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return max(num_new, 0) + num_free_hits

    def save_new_computed_blocks(self, request_id: str, new_computed_blocks: list[KVCacheBlock]) -> None:
        if new_computed_blocks:
            req_blocks = self.req_to_blocks[request_id]
            assert not req_blocks, "prefix hits are only taken before a request's first allocation"
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block[request_id] = len(new_computed_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request_id: str, block_hashes: list[BlockHash], num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = min(num_tokens // self.block_size, len(block_hashes))
        if num_full <= num_cached:
            return
        self.block_pool.cache_full_blocks(
            self.req_to_blocks[request_id], block_hashes, num_cached, num_full, self.group_id
        )
        self.num_cached_block[request_id] = num_full

    def free(self, request_id: str) -> None:
        """Release a request's blocks tail first, so its prefix stays cached the longest."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request_id, None)

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """Leading run of cached blocks, at most ``max_length`` tokens' worth."""
        hits: list[KVCacheBlock] = []
        for block_hash in block_hashes[: max_length // self.block_size]:
            cached = self.block_pool.get_cached_block(block_hash, [self.group_id])
            if cached is None:
                break
            hits.append(cached[0])
        return hits
