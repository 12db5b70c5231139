"""DiskIO: keyed records in one rank's tier file, written with a header (key, checksum) and
checked on every read, so nothing torn, flipped or misplaced is ever served."""

from __future__ import annotations

import os
from collections.abc import Sequence

from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.disk_format import RECORD_HEADER, DiskLayout, data_checksum, parse_record_header, record_header
from kvoffload.transfer.handler import BlockTransferError
from kvoffload.transfer.tier_io import TierIO


class DiskIO(TierIO):
    def __init__(self, layout: DiskLayout, path: str | os.PathLike) -> None:
        self.layout = layout
        self.path = str(path)
        self.name = f"disk tier {self.path}"
        # O_CREAT: the worker may start before the scheduler side creates and sizes the file
        # (vLLM builds workers first); the scheduler side then writes its header in place.
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        try:
            for data, slot, key in zip(blocks, slots, keys):
                header = record_header(key, data_checksum(data))
                written = os.pwritev(self.fd, [header, data], self.layout.offset(slot))
                if written != RECORD_HEADER + len(data):
                    raise OSError(f"short write of slot {slot}: {written} bytes")
        except OSError as exc:
            raise BlockTransferError(f"{self.name}: write failed: {exc}", [], io=True) from exc

    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        bad: list[int] = []
        header = bytearray(RECORD_HEADER)
        for slot, key, block in zip(slots, keys, out):
            try:
                n = os.preadv(self.fd, [header, block], self.layout.offset(slot))
            except OSError as exc:
                raise BlockTransferError(f"{self.name}: read of slot {slot} failed: {exc}", [slot], io=True) from exc
            parsed = parse_record_header(bytes(header))
            if n != RECORD_HEADER + len(block) or parsed is None or parsed[1] != data_checksum(block):
                bad.append(slot)  # torn, truncated or flipped
            elif parsed[0] != key:
                bad.append(slot)  # an intact record of another block: misplaced, never served
        if bad:
            raise BlockTransferError(f"{self.name}: records failed their checksum or key check: slots {bad[:8]}", bad)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
