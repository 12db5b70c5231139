"""StoreKeys: the name of each block's value in a shared store.

Replicas of other models, KV layouts, block sizes or parallel layouts share the same store, so
a key carries all of them: ``kvoffload/<layout digest>/<tokens>t<bytes>b/w<world>r<rank>/<hash>``.
A block of another namespace can never be looked up, let alone read; each rank reads only its
own shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.offload.abstract import BlockHash


class UnkeyableHashError(ValueError):
    """A block hash that has no stable text form (only bytes and ints are shared across processes)."""


def hash_text(block_hash: BlockHash) -> str:
    """A block hash as text that every process spells the same way."""
    if isinstance(block_hash, bytes):
        return block_hash.hex()
    if isinstance(block_hash, int) and not isinstance(block_hash, bool):
        return f"i{block_hash:x}" if block_hash >= 0 else f"n{-block_hash:x}"
    raise UnkeyableHashError(f"block hash {block_hash!r}: a shared store keys bytes or int hashes only")


@dataclass(frozen=True, slots=True)
class StoreKeys:
    namespace: str
    world_size: int = 1

    @classmethod
    def of(cls, layout_digest: str, block_tokens: int, block_bytes: int, world_size: int) -> StoreKeys:
        """Keys for one model and layout; ``block_bytes`` is one rank's share of a block."""
        return cls(f"kvoffload/{layout_digest or 'unnamed'}/{block_tokens}t{block_bytes}b/w{world_size}", world_size)

    def key(self, block_hash: BlockHash, rank: int) -> str:
        return f"{self.namespace}r{rank}/{hash_text(block_hash)}"

    def rank_keys(self, block_hashes: Sequence[BlockHash], rank: int) -> list[str]:
        return [self.key(h, rank) for h in block_hashes]

    def all_rank_keys(self, block_hashes: Sequence[BlockHash]) -> list[str]:
        """Every rank's key of each block, block-major (a block is usable when all its shards are)."""
        return [self.key(h, r) for h in block_hashes for r in range(self.world_size)]
