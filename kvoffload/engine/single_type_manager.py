"""Per-KV-cache-group block bookkeeping: which blocks each request holds in one group.

One manager per group, all sharing one BlockPool. A sliding-window manager differs from full
attention in two places: a prefix hit needs only the blocks of one window before its end (the
rest of the prefix is the null block), and blocks that fell out of the window are released to
the pool while the request runs, so a long request holds about one window per group.
"""

from __future__ import annotations

from collections import defaultdict

from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.hashing import BlockHash
from kvoffload.engine.kv_cache_block import KVCacheBlock
from kvoffload.errors import require_positive


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager:
    def __init__(self, block_pool: BlockPool, block_size: int, group_id: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.group_id = group_id
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading positions the next token no longer attends to (their blocks may go)."""
        return 0

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock], num_computed_tokens: int = 0
    ) -> int:
        """Blocks the pool must supply: fresh ones (not for skipped positions, which get the
        null block) plus cached hits that are currently free."""
        num_required = cdiv(num_tokens, self.block_size)
        have = len(new_computed_blocks) + len(self.req_to_blocks[request_id])
        skipped = self.num_skipped_tokens(num_computed_tokens) // self.block_size
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return max(num_required - max(have, skipped), 0) + num_free_hits

    def save_new_computed_blocks(self, request_id: str, new_computed_blocks: list[KVCacheBlock]) -> None:
        if new_computed_blocks:
            req_blocks = self.req_to_blocks[request_id]
            assert not req_blocks, "prefix hits are only taken before a request's first allocation"
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block[request_id] = len(new_computed_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_computed_tokens: int = 0) -> list[KVCacheBlock]:
        """Blocks up to ``num_tokens``: the null block for positions already out of the window
        of the first token to compute, fresh ones after. Returns what was appended."""
        req_blocks = self.req_to_blocks[request_id]
        num_required = cdiv(num_tokens, self.block_size)
        start = len(req_blocks)
        skipped = min(self.num_skipped_tokens(num_computed_tokens) // self.block_size, num_required)
        if start < skipped:
            req_blocks.extend([self.block_pool.null_block] * (skipped - start))
        num_new = num_required - len(req_blocks)
        if num_new > 0:
            req_blocks.extend(self.block_pool.get_new_blocks(num_new))
        return req_blocks[start:]

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Release the blocks no later token attends to (none for full attention)."""

    def cache_blocks(self, request_id: str, block_hashes: list[BlockHash], num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = min(num_tokens // self.block_size, len(block_hashes))
        if num_full <= num_cached:
            return
        self.block_pool.cache_full_blocks(
            self.req_to_blocks[request_id], block_hashes, num_cached, num_full, self.group_id
        )
        self.num_cached_block[request_id] = num_full

    def uncache_from(self, request_id: str, num_tokens: int) -> None:
        """The request's blocks from the one holding token ``num_tokens`` on serve no prefix
        hit any more (a load into them failed; the request recomputes them)."""
        first = num_tokens // self.block_size
        for block in self.req_to_blocks.get(request_id, [])[first:]:
            self.block_pool.uncache(block)
        if self.num_cached_block.get(request_id, 0) > first:
            self.num_cached_block[request_id] = first

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


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A group whose layers attend to the last ``window`` positions (the query's own included)."""

    def __init__(self, block_pool: BlockPool, block_size: int, group_id: int, window: int) -> None:
        super().__init__(block_pool, block_size, group_id)
        require_positive("sliding_window", window)
        self.window = window
        #: Cached blocks a hit needs: the window before the hit's end, less the query itself.
        self.hit_blocks = cdiv(window - 1, block_size)

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.window + 1)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        null = self.block_pool.null_block
        skipped = min(self.num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks))
        released = []
        for i in range(skipped - 1, -1, -1):
            if blocks[i] is null:
                break  # everything further left was released before
            released.append(blocks[i])
            blocks[i] = null
        self.block_pool.free_blocks(released)

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """The rightmost end, at most ``max_length`` tokens, whose window is cached: scanning
        from the right for ``hit_blocks`` cached blocks in a row (or a cached run reaching the
        first block). Positions left of that run are the null block."""
        n = min(max_length // self.block_size, len(block_hashes))
        if self.hit_blocks == 0:
            return [self.block_pool.null_block] * n
        run: list[KVCacheBlock] = []
        for i in range(n - 1, -1, -1):
            cached = self.block_pool.get_cached_block(block_hashes[i], [self.group_id])
            if cached is None:
                run = []
                continue
            run.append(cached[0])
            if len(run) == self.hit_blocks:
                return [self.block_pool.null_block] * i + run[::-1]
        return run[::-1]  # a cached run from the first block: nothing before it is needed
