"""The metadata record of one device KV block; it is its own free-list node."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.engine.hashing import BlockHash


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One physical block of the paged KV cache.

    ``prev_free_block`` / ``next_free_block`` are intrusive links used only while the block
    sits in the free queue, so that queue needs no wrapper nodes and can unlink in O(1).
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    group_id: int = 0
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hashed={self.block_hash is not None})"
