"""The value a shared store holds for one block: a 64-byte header, then the block's bytes.

The header names the key the value was written under (its xxh3-128) and the payload's xxh3-64,
so a value that was overwritten, torn, or copied under another key is detected on read and
dropped, never served. Replicas of other models never get this far: their keys differ.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash

HEADER_BYTES = 64
MAGIC = b"KVOREC01"
_BODY = struct.Struct("<8s16sQQ")  # magic, key digest, payload checksum, payload length
_CHECKED = struct.Struct("<8s16sQQQ")  # ... and the xxh64 of the fields before it


def key_digest(key: str) -> bytes:
    return xxhash.xxh3_128(key.encode()).digest()


def write_header(record: np.ndarray, key: str) -> None:
    """Fill ``record[:HEADER_BYTES]`` for the payload already in ``record[HEADER_BYTES:]``."""
    payload = record[HEADER_BYTES:]
    fields = (MAGIC, key_digest(key), xxhash.xxh3_64_intdigest(payload.data), payload.nbytes)
    header = _CHECKED.pack(*fields, xxhash.xxh64_intdigest(_BODY.pack(*fields)))
    record[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    record[len(header) : HEADER_BYTES] = 0


def check_record(record: np.ndarray, key: str) -> str | None:
    """Why ``record`` is not an intact value of ``key`` (None when it is)."""
    magic, digest, checksum, length, header_check = _CHECKED.unpack(record[: _CHECKED.size].tobytes())
    if magic != MAGIC or xxhash.xxh64_intdigest(_BODY.pack(magic, digest, checksum, length)) != header_check:
        return "not a kvoffload block record"
    if digest != key_digest(key):
        return "written under another key"
    payload = record[HEADER_BYTES:]
    if length != payload.nbytes:
        return f"holds {length} bytes, expected {payload.nbytes}"
    if xxhash.xxh3_64_intdigest(payload.data) != checksum:
        return "payload checksum mismatch"
    return None
