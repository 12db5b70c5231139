"""A log file somebody else wrote, read in bounded time and memory, line by line.

Request logs and traces come from users' servers and from the internet: a line can be gigabytes
(one forgotten newline, or a gzip bomb), a gzip file can be cut short, bytes can be another
encoding, and a megabyte of gzipped newlines unpacks to a billion empty lines. So lines are found
in the raw bytes at C speed (a run of blank lines costs no Python step per line), a line longer
than ``MAX_LINE_BYTES`` and a file unpacking past ``MAX_TEXT_BYTES`` are refused, and every fault
becomes one ``RequestLogError`` naming the file, the line and the fix.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvoffload.errors import describe_value

#: A request with a 5M-token prompt as token ids is about 40 MB of JSON; parsing a line costs
#: about 40x its size in memory, so this bounds one line's cost at a few GB.
MAX_LINE_BYTES = 64 << 20
#: Text a log may unpack to (a day of a busy fleet's requests is a few GB).
MAX_TEXT_BYTES = 64 << 30
_CHUNK = 4 << 20
_CONTENT = re.compile(rb"\S")


class RequestLogError(ValueError):
                      """A request log or trace that cannot be replayed: the file or line, the field, and the fix."""


#: Past this much text, a gzipped log unpacking to more than this many times its compressed size
#: is a gzip bomb (logs compress 3-50x; gzip's limit is about 1,000x).
BOMB_AFTER_BYTES = 1 << 30
BOMB_RATIO = 200


def _decode(raw: bytes, n: int, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestLogError(f"{path} line {n}: not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1}); "
                              "save the log as UTF-8") from None


def read_lines(path: str | Path, max_line: int = MAX_LINE_BYTES, max_text: int = MAX_TEXT_BYTES,
               chunk_bytes: int = _CHUNK) -> Iterator[tuple[int, str]]:
    """The file's non-blank lines as (line number from 1, text without its newline); plain or
    gzipped (``.gz``)."""
    path = Path(path)
    buf = bytearray()
    lines = 0  # newlines consumed before buf[0]
    total = 0
    try:
        with open(path, "rb") as raw, (gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw) as f:
            while True:
                chunk = f.read(chunk_bytes)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_text or (f is not raw and total > BOMB_AFTER_BYTES
                                        and total > BOMB_RATIO * raw.tell()):
                    at = lines + buf.count(b"\n") + 1
                    raise RequestLogError(f"{path}: unpacks to more than {min(total, max_text) >> 30} GiB of text, "
                                          f"{total // max(1, raw.tell()):,}x its size on disk (read to line {at:,}); "
                                          "split the log, or give a part of it")
                if not buf and chunk.isspace():  # a stretch of blank lines: counted, nothing kept
                    lines += chunk.count(b"\n")
                    continue
                buf += chunk
                pos = 0
                while True:
                    m = _CONTENT.search(buf, pos)
                    if m is None:  # only blank space left: count its newlines, keep nothing
                        lines += buf.count(b"\n", pos)
                        buf.clear()
                        break
                    start = buf.rfind(b"\n", pos, m.start()) + 1 or pos
                    lines += buf.count(b"\n", pos, start)
                    end = buf.find(b"\n", m.start())
                    if end < 0:  # the line goes on in the next chunk
                        del buf[:start]
                        if len(buf) > max_line:
                            raise _too_long(path, lines + 1, max_line)
                        break
                    if end - start > max_line:
                        raise _too_long(path, lines + 1, max_line)
                    lines += 1
                    yield lines, _decode(bytes(buf[start:end]), lines, path)
                    pos = end + 1
            if buf.strip():
                yield lines + 1, _decode(bytes(buf), lines + 1, path)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise RequestLogError(f"{path}: a damaged gzip file ({exc}) after line {lines:,}; compress the log again, or "
                              "give it uncompressed") from None


def _too_long(path: Path, n: int, max_line: int) -> RequestLogError:
    return RequestLogError(f"{path} line {n:,}: longer than {max_line >> 20} MiB; a log holds one request a line "
                           "(is a newline missing?)")


def parse_json(text: str, where: str) -> Any:
    """One JSON value; a RequestLogError naming ``where`` for what is not JSON, nests past Python's
    recursion limit, or holds an integer of thousands of digits."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        what = exc.msg.removesuffix(" at")  # "Unterminated string starting at" names no place by itself
        raise RequestLogError(f"{where}: not JSON at column {exc.colno} ({what}); one object a line") from None
    except RecursionError:
        raise RequestLogError(f"{where}: JSON nested too deeply to read; a request is an object a few levels deep") from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise RequestLogError(f"{where}: {str(exc)[:120]}") from None


def number(value: Any, where: str, high: float, low: float = 0.0, why: str = "") -> float:
    """``value`` as a float in [low, high]: an int or a float, finite, in range; a RequestLogError
    naming ``where`` and the range otherwise (an integer of hundreds of digits included: it
    would overflow a float, or a numpy array, further on)."""
    # A large int compares with the float bounds exactly (no overflow); NaN fails both comparisons.
    ok = isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high
    if not ok:
        raise RequestLogError(f"{where} must be a finite number in [{low:g}, {high:g}], got {describe_value(value)}{why}")
    return float(value)
