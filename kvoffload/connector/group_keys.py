"""Offload keys and load windows of a hybrid model's KV-cache groups.

Each group (a block table of its own: full attention, or a sliding window) offloads its own
blocks, keyed by the block's chained hash and the group: group 0's key is the hash itself (a
single-group model keeps the keys it always had), group g's is xxh3-128 over the group and the
hash. A prefix hit of ``n`` offloaded blocks needs every full-attention group's blocks up to
``n`` but a sliding-window group's only from the first block any token at or after ``n`` still
attends to: the hit is all-or-nothing over the groups, and a sliding group loads just that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from kvoffload.offload.abstract import BlockHash

#: The engine's null block: a position a sliding-window group no longer keeps (vLLM's too).
NULL_BLOCK_ID = 0


def group_key(block_hash: BlockHash, group: int) -> BlockHash:
    if group == 0:
        return block_hash
    raw = block_hash if isinstance(block_hash, bytes) else repr(block_hash).encode()
    return xxhash.xxh3_128(b"group%d|" % group + raw).digest()


@dataclass(frozen=True, slots=True)
class GroupGeometry:
    #: Per group: the sliding window in tokens (None: full attention).
    windows: tuple[int | None, ...]
    block_size: int  # engine tokens per block
    factor: int  # engine blocks per offloaded block
    #: The full-attention groups and the sliding-window ones, by index (read every step: kept).
    full_groups: tuple[int, ...] = field(init=False)
    sliding_groups: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "full_groups", tuple(g for g, w in enumerate(self.windows) if w is None))
        object.__setattr__(self, "sliding_groups", tuple(g for g, w in enumerate(self.windows) if w is not None))

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def is_hybrid(self) -> bool:
        return len(self.windows) > 1

    def first_needed(self, group: int, end: int) -> int:
        """The first offloaded block group ``group`` needs to serve a hit of ``end`` offloaded
        blocks: 0 for full attention; for a window, the block holding the earliest position the
        token at the hit's end attends to (the engine keeps the null block left of it)."""
        window = self.windows[group]
        if window is None:
            return 0
        end_tokens = end * self.block_size * self.factor
        skipped_engine_blocks = max(0, end_tokens - window + 1) // self.block_size
        return skipped_engine_blocks // self.factor

    def keys(self, hashes: list[BlockHash], group: int) -> list[BlockHash]:
        return hashes if group == 0 else [group_key(h, group) for h in hashes]

    def useful_keys(self, hashes: list[BlockHash]) -> list[list[BlockHash]]:
        """Per group (full-attention groups first), the keys of a request's blocks that a hit at
        its end would need: every block of a full-attention group, the last window of a sliding one."""
        n = len(hashes)
        return [self.keys(hashes[self.first_needed(g, n):], g) for g in (*self.full_groups, *self.sliding_groups)]
