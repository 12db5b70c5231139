"""BlockPool: every device KV block, the free queue, and the prefix-cache hash map."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.engine.free_queue import FreeKVCacheBlockQueue
from kvoffload.engine.hashing import BlockHash
from kvoffload.engine.kv_cache_block import KVCacheBlock

#: Prefix-cache key: the chained block hash and the KV-cache group it belongs to.
BlockHashWithGroupId = tuple[BlockHash, int]


class BlockPool:
    """Owns all blocks; block 0 is the null block (a placeholder that is never allocated).

    A freed block keeps its hash and stays findable until ``get_new_blocks`` hands it out
    again: that is the device prefix cache, with the free queue as its LRU order.
    """

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_gpu_blocks={num_blocks}: need at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHashWithGroupId, KVCacheBlock] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.num_cache_evictions = 0

    def get_cached_block(self, block_hash: BlockHash, group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """The cached block of ``block_hash`` in each group, or None if any group misses."""
        out = []
        for gid in group_ids:
            block = self.cached_block_hash_to_block.get((block_hash, gid))
            if block is None:
                return None
            out.append(block)
        return out

    def cache_full_blocks(
        self,
        blocks: list[KVCacheBlock],
        block_hashes: list[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        group_id: int,
    ) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] under their hashes."""
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or block.block_hash is not None:
                continue
            block.block_hash = block_hashes[i]
            block.group_id = group_id
            # First writer wins: a duplicate computed concurrently stays uncached and is freed.
            self.cached_block_hash_to_block.setdefault((block_hashes[i], group_id), block)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} blocks, only {self.get_num_free_blocks()} are free")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
        return blocks

    def uncache(self, block: KVCacheBlock) -> None:
        """``block`` no longer serves prefix hits (its KV is wrong and is being recomputed)."""
        self._maybe_evict_cached_block(block)

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        if block.block_hash is None:
            return False
        key = (block.block_hash, block.group_id)
        if self.cached_block_hash_to_block.get(key) is block:
            del self.cached_block_hash_to_block[key]
        block.block_hash = None
        self.num_cache_evictions += 1
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take prefix-hit blocks: a free (ref_cnt 0) one leaves the free queue."""
        for block in blocks:
            if block.is_null:
                continue  # a placeholder for positions a sliding window keeps none of: never counted
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each; blocks reaching 0 go to the free-queue tail in order."""
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"{block!r} freed more often than taken"
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is still in use."""
        if self.get_num_free_blocks() != self.num_blocks - 1:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            block.block_hash = None
        return True

    def is_empty(self) -> bool:
        """Every block is free (none held by any request)."""
        return self.get_num_free_blocks() == self.num_blocks - 1

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / (self.num_blocks - 1)
