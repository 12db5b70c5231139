"""Chained, process-stable block hashes for prefix caching.

hash(block N) = H(hash(block N-1), tokens of block N, extra keys). H is xxh3-128 over a
canonical little-endian encoding, so a hash is identical across processes, restarts and
machines: the disk tier and trace files rely on that (Python's salted ``hash`` would not do).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

BlockHash = bytes

#: Names the hash function and encoding below (part of every offload namespace).
HASH_ALGORITHM = "xxh3_128-le64"
#: Parent of the first block: a fixed seed, not an empty string, so no real hash collides with it.
ROOT_BLOCK_HASH: BlockHash = xxhash.xxh3_128(b"kvoffload-root-block").digest()


def _encode_extra_key(key: object) -> bytes:
    if isinstance(key, bool):
        return b"b" + (b"1" if key else b"0")
    if isinstance(key, int):
        return b"i" + str(key).encode()
    if isinstance(key, str):
        data = key.encode("utf-8")
        return b"s" + struct.pack("<I", len(data)) + data
    if isinstance(key, bytes):
        return b"y" + struct.pack("<I", len(key)) + key
    if isinstance(key, tuple):
        return b"t" + struct.pack("<I", len(key)) + b"".join(_encode_extra_key(k) for k in key)
    raise TypeError(
        f"extra hash key {key!r} has type {type(key).__name__}; use str, int, bytes or tuples of them"
    )


def hash_block_tokens(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple | None = None
) -> BlockHash:
    """Digest of one full block, chained to its parent's digest."""
    h = xxhash.xxh3_128(parent if parent is not None else ROOT_BLOCK_HASH)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra_keys:
        h.update(_encode_extra_key(tuple(extra_keys)))
    return h.digest()


def hash_request_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: tuple | None = None,
    parent: BlockHash | None = None,
    start_block: int = 0,
) -> list[BlockHash]:
    """Hashes of every full block from ``start_block`` on; a trailing partial block is skipped.

    Extra keys (cache salt, adapter name) enter only block 0: every later hash inherits them
    through the chain.
    """
    hashes: list[BlockHash] = []
    num_full = len(token_ids) // block_size
    for i in range(start_block, num_full):
        keys = extra_keys if i == 0 else None
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size], keys)
        hashes.append(parent)
    return hashes
