"""KVCacheManager: the scheduler's interface to device blocks (prefix hits, allocation, free)."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.kv_cache_block import KVCacheBlock
from kvoffload.engine.kv_cache_coordinator import KVCacheCoordinator
from kvoffload.engine.request import Request
from kvoffload.errors import require_positive


@dataclass(slots=True)
class KVCacheBlocks:
    """Blocks per KV-cache group; ``get_block_ids`` is what travels to the worker."""

    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks)))

    @property
    def num_blocks(self) -> int:
        return len(self.blocks[0]) if self.blocks else 0


@dataclass(slots=True)
class PrefixCacheStats:
    queries: int = 0
    hits: int = 0


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = True,
        windows: tuple[int | None, ...] = (None,),
    ) -> None:
        """``windows``: one entry per KV-cache group, its sliding window in tokens or None."""
        require_positive("block_size", block_size)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.coordinator = KVCacheCoordinator(self.block_pool, block_size, windows)
        self.num_groups = len(windows)
        self.prefix_cache_stats = PrefixCacheStats()
        #: Copy-on-write work queued for the runner: (src block, dst block) and, per request,
        #: (block index, new block id) replacements. Drained by the scheduler each step.
        self.pending_copies: list[tuple[int, int]] = []
        self.pending_replacements: dict[str, list[tuple[int, int, int]]] = {}
        self.num_cow_copies = 0
        self.num_forks = 0

    def empty_blocks(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple([] for _ in range(self.num_groups)))

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix of full blocks; the last prompt token is always recomputed."""
        if not self.enable_caching:
            return self.empty_blocks(), 0
        max_hit = request.num_tokens - 1
        blocks, num_hit_tokens = self.coordinator.find_longest_cache_hit(request.block_hashes, max_hit)
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_hit_tokens
        return KVCacheBlocks(blocks), num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        reserve_blocks: int = 0,
    ) -> KVCacheBlocks | None:
        """Make room for | computed | new_computed | external_computed | new | lookahead |.

        Returns the freshly allocated blocks, or None (and nothing changed) when the pool cannot
        supply them while keeping ``reserve_blocks`` free (the admission watermark). A write into
        a block shared with a forked sequence first gives this request a private copy. With
        ``delay_cache_blocks`` the new blocks are not yet registered in the
        prefix cache: their contents are still arriving from an external source.
        """
        if num_new_tokens < 0 or num_external_computed_tokens < 0:
            raise ValueError(
                f"allocate_slots: num_new_tokens={num_new_tokens}, "
                f"num_external_computed_tokens={num_external_computed_tokens} must be >= 0"
            )
        computed = new_computed_blocks.blocks if new_computed_blocks else self.empty_blocks().blocks
        # Sliding-window groups release the blocks their next token no longer sees first.
        self.coordinator.remove_skipped_blocks(request.request_id, request.num_computed_tokens)
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        num_computed = num_local_computed + num_external_computed_tokens
        num_tokens_need_slot = min(num_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        # Lookahead (an async load reserving the rest of its prompt) is for full-attention groups.
        sliding_tokens = min(num_computed + num_new_tokens, self.max_model_len)
        need = self.coordinator.get_num_blocks_to_allocate(request.request_id, num_tokens_need_slot, computed,
                                                           num_computed, sliding_tokens)
        cow = self._shared_write_blocks(request.request_id, num_local_computed)
        if need + len(cow) + reserve_blocks > self.block_pool.get_num_free_blocks():
            return None
        self._copy_on_write(request.request_id, cow)
        if self.enable_caching:
            for group in computed:
                self.block_pool.touch(group)
        self.coordinator.save_new_computed_blocks(request.request_id, computed)
        new_blocks = self.coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot, num_computed,
                                                          sliding_tokens)
        if self.enable_caching and not delay_cache_blocks:
            num_tokens_to_cache = min(
                num_local_computed + num_external_computed_tokens + num_new_tokens, request.num_tokens
            )
            self.coordinator.cache_blocks(request.request_id, request.block_hashes, num_tokens_to_cache)
        return KVCacheBlocks(new_blocks)

    def _shared_write_blocks(self, request_id: str, first_write_pos: int) -> list[tuple[int, int]]:
        """(group, block index) of the block the next token is written into, if shared."""
        idx = first_write_pos // self.block_size
        out = []
        for gid, group in enumerate(self.coordinator.get_blocks(request_id)):
            if idx < len(group) and group[idx].ref_cnt > 1 and not group[idx].is_null:
                out.append((gid, idx))
        return out

    def _copy_on_write(self, request_id: str, cow: list[tuple[int, int]]) -> None:
        for gid, idx in cow:
            blocks = self.coordinator.managers[gid].req_to_blocks[request_id]
            old = blocks[idx]
            (new,) = self.block_pool.get_new_blocks(1)
            blocks[idx] = new
            self.block_pool.free_blocks([old])  # the other sharers keep it
            self.pending_copies.append((old.block_id, new.block_id))
            self.pending_replacements.setdefault(request_id, []).append((gid, idx, new.block_id))
            self.num_cow_copies += 1

    def fork(self, parent: Request, child: Request) -> None:
        """The child shares every parent block (ref counts up, zero bytes copied)."""
        for manager in self.coordinator.managers:
            blocks = list(manager.req_to_blocks.get(parent.request_id, ()))
            for block in blocks:
                if not block.is_null:
                    block.ref_cnt += 1
            manager.req_to_blocks[child.request_id] = blocks
            manager.num_cached_block[child.request_id] = manager.num_cached_block.get(parent.request_id, 0)
        self.num_forks += 1

    def cancel_copy_on_write(self, request_id: str) -> dict[int, int]:
        """Drop this step's pending copies into ``request_id``'s private blocks (it is being
        preempted: they are freed, and copying into a freed block is wrong). Returns
        private id -> source id: until the forward pass the source still holds the bytes."""
        mine = {new for _, _, new in self.pending_replacements.pop(request_id, ())}
        if not mine:
            return {}
        redirect = {new: old for old, new in self.pending_copies if new in mine}
        self.pending_copies = [(old, new) for old, new in self.pending_copies if new not in mine]
        return redirect

    def take_copy_on_write(self) -> tuple[list[tuple[int, int]], dict[str, list[tuple[int, int, int]]]]:
        copies, self.pending_copies = self.pending_copies, []
        repl, self.pending_replacements = self.pending_replacements, {}
        return copies, repl

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self.coordinator.cache_blocks(request.request_id, request.block_hashes, num_computed_tokens)

    def uncache_from(self, request: Request, num_tokens: int) -> None:
        """Blocks of ``request`` past ``num_tokens`` tokens leave the prefix cache (recomputed)."""
        self.coordinator.uncache_from(request.request_id, num_tokens)

    def free(self, request: Request) -> None:
        self.coordinator.free(request.request_id)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()
