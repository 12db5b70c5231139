"""The value a shared store holds for one block: a 64-byte header, then the block's bytes.

The header names the key the value was written under (its xxh3-128), the payload's length and
its tag (``kvoffload.auth``: a checksum, or with a shared secret a MAC over the full key, which
carries the namespace, and the payload), so a value that was overwritten, torn, copied under
another key or (with a secret) forged is detected on read and dropped, never served.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash

from kvoffload.auth import RecordTagger

HEADER_BYTES = 64
MAGIC = b"KVOREC02"
_BODY = struct.Struct("<8s16s16sQ")  # magic, key digest, tag, payload length
_CHECKED = struct.Struct("<8s16s16sQQ")  # ... and the xxh64 of the fields before it
_PLAIN = RecordTagger()


def key_digest(key: str) -> bytes:
    return xxhash.xxh3_128(key.encode()).digest()


def make_header(key: str, payload: memoryview, tagger: RecordTagger = _PLAIN) -> bytes:
    """The 64-byte header of ``payload`` stored under ``key``."""
    fields = (MAGIC, key_digest(key), tagger.tag(key.encode(), payload), payload.nbytes)
    return _CHECKED.pack(*fields, xxhash.xxh64_intdigest(_BODY.pack(*fields))).ljust(HEADER_BYTES, b"\0")


def write_header(record: np.ndarray, key: str, tagger: RecordTagger = _PLAIN) -> None:
    """Fill ``record[:HEADER_BYTES]`` for the payload already in ``record[HEADER_BYTES:]``."""
    record[:HEADER_BYTES] = np.frombuffer(make_header(key, record[HEADER_BYTES:].data, tagger), dtype=np.uint8)


def check_header(header: bytes, payload: memoryview, key: str, tagger: RecordTagger = _PLAIN) -> tuple[str, str] | None:
    """(reason, why) ``header`` + ``payload`` is not an intact value of ``key``; None if it is.
    Reasons are the labels of kvoffload_tier_rejected_blocks_total."""
    magic, digest, tag, length, header_check = _CHECKED.unpack(header[: _CHECKED.size])
    if magic != MAGIC or xxhash.xxh64_intdigest(_BODY.pack(magic, digest, tag, length)) != header_check:
        return "format", "not a kvoffload block record"
    if digest != key_digest(key):
        return "key", "written under another key"
    if length != payload.nbytes:
        return "format", f"holds {length} bytes, expected {payload.nbytes}"
    if not tagger.check(key.encode(), payload, tag):
        return tagger.failure_reason, ("MAC mismatch: not written with this tier's secret"
                                       if tagger.authenticated else "payload checksum mismatch")
    return None


def check_record(record: np.ndarray, key: str, tagger: RecordTagger = _PLAIN) -> tuple[str, str] | None:
    """``check_header`` of a record held in one piece."""
    return check_header(record[:HEADER_BYTES].tobytes(), record[HEADER_BYTES:].data, key, tagger)
