"""DiskIO: keyed records in one rank's tier file, written with a header (key, tag) and checked
on every read, so nothing torn, flipped, misplaced or (with a shared secret) planted is served."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Sequence

from kvoffload.auth import RecordTagger
from kvoffload.offload.abstract import BlockHash
from kvoffload.safe_files import open_file
from kvoffload.tiers.disk.format import RECORD_HEADER, DiskLayout, key_bytes, parse_record_header, record_header
from kvoffload.transfer.result import BlockTransferError
from kvoffload.transfer.tier_io import TierIO


def record_problem(header: bytes | bytearray, data: bytes | memoryview, complete: bool, key: BlockHash,
                   tagger: RecordTagger) -> str | None:
    """Why a record read back for ``key`` must not be served, as its rejection reason, or None
    when it is intact; ``complete``: the whole record (header and data) was read. The one set
    of rules for a load and for ``kvoffload cache verify``."""
    parsed = parse_record_header(bytes(header))
    if not complete or parsed is None:
        return "format"  # torn, truncated or never written
    if parsed[0] != key:
        return "key"  # an intact record of another block: misplaced, never served
    if not tagger.check(key_bytes(key), data, parsed[1]):
        return tagger.failure_reason  # flipped, or written without the secret
    return None


class DiskIO(TierIO):
    def __init__(self, layout: DiskLayout, path: str | os.PathLike[str], tagger: RecordTagger | None = None) -> None:
        self.layout = layout
        self.tagger = tagger or RecordTagger()
        self.path = str(path)
        self.name = f"disk tier {self.path}"
        # Opened at the first transfer, not here: the worker may start before the scheduler side
        # creates and locks the file (vLLM builds workers first), and a file created here could
        # be cleared (it is unlocked) and leave this process writing to a deleted one. Every
        # transfer comes after the scheduler side has opened and locked the file.
        self.fd = -1
        self._opening = threading.Lock()  # loads and stores run on threads of their own
        self._closed = False

    def _file(self) -> int:
        if self.fd >= 0:
            return self.fd
        with self._opening:
            if self._closed:
                raise BlockTransferError(f"{self.name}: closed", [], io=True)
            if self.fd < 0:
                try:
                    self.fd = open_file(self.path, os.O_RDWR)
                except OSError as exc:
                    raise BlockTransferError(f"{self.name}: cannot open ({exc.strerror}); the scheduler side "
                                             "creates it: is it running, and is nothing else writing the "
                                             "directory?", [], io=True) from exc
            return self.fd

    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        try:
            fd = self._file()
            for data, slot, key in zip(blocks, slots, keys):
                header = record_header(key, self.tagger.tag(key_bytes(key), data))
                written = os.pwritev(fd, [header, data], self.layout.offset(slot))
                if written != RECORD_HEADER + len(data):
                    raise OSError(f"short write of slot {slot}: {written} bytes")
        except OSError as exc:
            raise BlockTransferError(f"{self.name}: write failed: {exc}", [], io=True) from exc

    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        bad: list[int] = []
        reasons: Counter[str] = Counter()
        header = bytearray(RECORD_HEADER)
        fd = self._file()
        for slot, key, block in zip(slots, keys, out):
            try:
                n = os.preadv(fd, [header, block], self.layout.offset(slot))
            except OSError as exc:
                raise BlockTransferError(f"{self.name}: read of slot {slot} failed: {exc}", [slot], io=True) from exc
            reason = record_problem(header, block, n == RECORD_HEADER + len(block), key, self.tagger)
            if reason is None:
                continue
            bad.append(slot)
            reasons[reason] += 1
        if bad:
            raise BlockTransferError(f"{self.name}: records failed their checks ({dict(reasons)}): slots {bad[:8]}",
                                     bad, reasons=dict(reasons))

    def close(self) -> None:
        with self._opening:
            self._closed = True  # a copy finishing after this must not open the file again
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
