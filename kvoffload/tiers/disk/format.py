"""On-disk format of the disk tier: one preallocated file of fixed-size slot records.

    file header (4 KiB): magic, version, layout digest, block bytes, block tokens, slots
    slot i at HEADER_BYTES + i * (RECORD_HEADER + block_bytes):
        record header (64 B): magic, key type, key length, key (<= 32 B), tag (16 B), header xxh64
        data (block_bytes)

A record is written with one positioned write. On open, record headers are scanned (their own
checksum rejects torn or stale headers); the tag (a checksum of the data, or with a shared
secret a MAC over namespace, key and data: ``kvoffload.auth``) is verified on every read, so a
torn, flipped or planted block is detected before it could be served. The file name carries the layout
digest, and the header repeats it: a cache written for another model or layout is never read.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import xxhash

FILE_MAGIC = b"KVOFFLD\x01"
FORMAT_VERSION = 2  # 2: a 16-byte tag (checksum or MAC) in place of the data xxh64
HEADER_BYTES = 4096
RECORD_HEADER = 64
_REC_MAGIC = b"KVB1"
_FILE_FMT = "<8sI32sQQQ"  # magic, version, digest, block_bytes, block_tokens, num_slots
_REC_FMT = "<4sBB32s16s"  # magic, key type, key length, key, tag  (then header checksum)
_KEY_BYTES, _KEY_INT = 1, 2
_SEEK_DATA: int | None = getattr(os, "SEEK_DATA", None)
_FS_BLOCK = 4096


class DiskFormatError(ValueError):
    pass


def encode_key(key: Hashable) -> tuple[int, bytes]:
    if isinstance(key, bytes) and len(key) <= 32:
        return _KEY_BYTES, key
    if isinstance(key, int) and not isinstance(key, bool) and -(2**63) <= key < 2**63:
        return _KEY_INT, struct.pack("<q", key)
    raise DiskFormatError(f"block hash {key!r}: the disk tier stores bytes (<= 32) or 64-bit int hashes")


def decode_key(kind: int, raw: bytes) -> Hashable:
    return raw if kind == _KEY_BYTES else struct.unpack("<q", raw)[0]


@dataclass(frozen=True, slots=True)
class DiskLayout:
    digest: str
    block_bytes: int
    block_tokens: int
    num_slots: int
    #: Under tensor/pipeline parallelism each rank keeps its own shard of every block in its
    #: own file; rank and world size enter the file name and header, so no rank reads another's.
    rank: int = 0
    world_size: int = 1

    def for_rank(self, rank: int) -> DiskLayout:
        return DiskLayout(self.digest, self.block_bytes, self.block_tokens, self.num_slots, rank, self.world_size)

    @property
    def file_digest(self) -> str:
        return self.digest if self.world_size == 1 else f"{self.digest}|r{self.rank}/{self.world_size}"

    @property
    def record_bytes(self) -> int:
        return RECORD_HEADER + self.block_bytes

    def offset(self, slot: int) -> int:
        return HEADER_BYTES + slot * self.record_bytes

    @property
    def file_bytes(self) -> int:
        return self.offset(self.num_slots)

    def file_header(self) -> bytes:
        body = struct.pack(_FILE_FMT, FILE_MAGIC, FORMAT_VERSION, self.file_digest.encode()[:32].ljust(32, b"\0"),
                           self.block_bytes, self.block_tokens, self.num_slots)
        return body.ljust(HEADER_BYTES, b"\0")

    def matches(self, header: bytes) -> bool:
        return len(header) >= HEADER_BYTES and header[:HEADER_BYTES] == self.file_header()


def parse_file_header(raw: bytes) -> tuple[DiskLayout, str] | None:
    """(layout, the digest its records are tagged under) of a tier file's header; None for a
    file of another format or version. Rank and world size come from the file digest."""
    size = struct.calcsize(_FILE_FMT)
    if len(raw) < size or raw[:8] != FILE_MAGIC:
        return None
    _, version, digest_raw, block_bytes, block_tokens, num_slots = struct.unpack(_FILE_FMT, raw[:size])
    if version != FORMAT_VERSION:
        return None
    file_digest = digest_raw.rstrip(b"\0").decode(errors="replace")
    digest, rank, world = file_digest, 0, 1
    if "|r" in file_digest:
        digest, _, where = file_digest.partition("|r")
        r, _, w = where.partition("/")
        if r.isdigit() and w.isdigit():
            rank, world = int(r), int(w)
    return DiskLayout(digest, block_bytes, block_tokens, num_slots, rank, world), file_digest


def record_header(key: Hashable, tag: bytes) -> bytes:
    kind, raw = encode_key(key)
    body = struct.pack(_REC_FMT, _REC_MAGIC, kind, len(raw), raw.ljust(32, b"\0"), tag)
    return (body + struct.pack("<Q", xxhash.xxh64_intdigest(body))).ljust(RECORD_HEADER, b"\0")


def parse_record_header(raw: bytes) -> tuple[Hashable, bytes] | None:
    """(key, tag), or None for an empty, torn or foreign header."""
    size = struct.calcsize(_REC_FMT)
    if len(raw) < size + 8 or raw[:4] != _REC_MAGIC:
        return None
    body, (check,) = raw[:size], struct.unpack("<Q", raw[size : size + 8])
    if xxhash.xxh64_intdigest(body) != check:
        return None
    _, kind, length, key, tag = struct.unpack(_REC_FMT, body)
    if kind not in (_KEY_BYTES, _KEY_INT) or length > 32:
        return None
    return decode_key(kind, key[:length]), tag


def data_checksum(data: bytes | memoryview) -> bytes:
    """The tag of a record without a shared secret (what ``RecordTagger().tag`` computes)."""
    return xxhash.xxh3_128_digest(data)


def key_bytes(key: Hashable) -> bytes:
    """The bytes a record's tag covers for ``key`` (its type and encoding)."""
    kind, raw = encode_key(key)
    return bytes([kind]) + raw


def scan_records(fd: int, layout: DiskLayout) -> Iterator[tuple[int, Hashable, bool]]:
    """(slot, key, intact) for every slot holding a record header.

    ``intact`` is False for a record cut short by the end of the file (truncation) or whose
    header checksum fails while its magic is present (a torn header). Empty slots are skipped.
    The file is sparse (preallocated by truncation), so the scan jumps from one written region
    to the next (``SEEK_DATA``): reopening costs time in proportion to the records present,
    not to the tier's capacity. Filesystems without holes report all data: every slot is read.
    """
    size = os.fstat(fd).st_size
    pos = layout.offset(0)
    while pos < size:
        data = pos
        if _SEEK_DATA is not None:
            try:
                data = os.lseek(fd, pos, _SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    return  # nothing but holes after pos
        if data >= size:
            return
        slot = max(0, (data - layout.offset(0)) // layout.record_bytes)
        if slot >= layout.num_slots:
            return
        off = layout.offset(slot)
        pos = layout.offset(slot + 1)
        raw = os.pread(fd, RECORD_HEADER, off)
        if raw[:4] != _REC_MAGIC:
            # Empty: the data found was the previous record's tail; search on from the next
            # filesystem block (a few reads per record, however large the tier).
            pos = max(data + 1, off + RECORD_HEADER)
            pos = -(-pos // _FS_BLOCK) * _FS_BLOCK
            continue
        parsed = parse_record_header(raw)
        if parsed is None:
            yield slot, None, False
            continue
        yield slot, parsed[0], off + layout.record_bytes <= size
