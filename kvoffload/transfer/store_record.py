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


def make_header(key: str, payload: memoryview) -> bytes:
    """The 64-byte header of ``payload`` stored under ``key``."""
    fields = (MAGIC, key_digest(key), xxhash.xxh3_64_intdigest(payload), payload.nbytes)
    return _CHECKED.pack(*fields, xxhash.xxh64_intdigest(_BODY.pack(*fields))).ljust(HEADER_BYTES, b"\0")


def write_header(record: np.ndarray, key: str) -> None:
    """Fill ``record[:HEADER_BYTES]`` for the payload already in ``record[HEADER_BYTES:]``."""
    record[:HEADER_BYTES] = np.frombuffer(make_header(key, record[HEADER_BYTES:].data), dtype=np.uint8)


def check_header(header: bytes, payload: memoryview, key: str) -> str | None:
    """Why ``header`` + ``payload`` is not an intact value of ``key`` (None when it is)."""
    magic, digest, checksum, length, header_check = _CHECKED.unpack(header[: _CHECKED.size])
    if magic != MAGIC or xxhash.xxh64_intdigest(_BODY.pack(magic, digest, checksum, length)) != header_check:
        return "not a kvoffload block record"
    if digest != key_digest(key):
        return "written under another key"
    if length != payload.nbytes:
        return f"holds {length} bytes, expected {payload.nbytes}"
    if xxhash.xxh3_64_intdigest(payload) != checksum:
        return "payload checksum mismatch"
    return None


def check_record(record: np.ndarray, key: str) -> str | None:
    """``check_header`` of a record held in one piece."""
    return check_header(record[:HEADER_BYTES].tobytes(), record[HEADER_BYTES:].data, key)
