"""A user's request log, as people keep them: OpenAI-style JSONL, one request a line.

Each line is an object with the prompt as ``prompt_token_ids`` (token ids), ``prompt`` (text)
or ``messages`` (a chat: ``[{"role", "content"}]``, the whole conversation so far, as a client
sends it); optionally ``timestamp`` (seconds, or milliseconds when above 1e11), ``session`` or
``user`` (which conversation it continues), ``max_tokens`` and ``duration_s`` (seconds from
sending it to its response's last token). Text is turned into token ids by a
stand-in for the model's tokenizer (none is needed to replay a log): words and punctuation, each
hashed into the vocabulary. It keeps what caching depends on: two prompts that start with the
same text start with the same tokens, so shared prefixes stay shared; the token counts are
words, not the model's tokens. Token-id logs are replayed exactly.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from kvoffload.errors import describe_value
from kvoffload.log_lines import RequestLogError, number, parse_json, read_lines

#: A reply longer than this is a broken log line, not a request.
MAX_TOKENS = 10_000_000
#: The most words a text prompt is read to (a few million tokens is the longest context served).
MAX_TEXT_TOKENS = 4_000_000
#: A timestamp past this (milliseconds: the year 5138) is corrupt, not a time.
MAX_TIMESTAMP = 1e14
#: A request that took longer than this (about four months) is a broken line.
MAX_SECONDS = 1e7
MAX_SESSION_CHARS = 1000
#: Token ids below this are left to the model's special tokens.
FIRST_ID = 10
_WORDS = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    line: int
    tokens: tuple[int, ...]
    #: Seconds since the log's first request (0 without timestamps; a line without one arrives
    #: with the timed line before it).
    t: float
    session: str | None
    max_tokens: int | None
    #: The prompt came as text and went through the stand-in tokenizer.
    from_text: bool
    #: Seconds from sending the request to its response's last token (None: not logged).
    duration_s: float | None = None


def stand_in_tokens(text: str, vocab: int, line: int = 0) -> tuple[int, ...]:
    """Words and punctuation of ``text``, each hashed into ``[FIRST_ID, vocab)``. Word by word
    into 8 bytes a token, never a list of every word (a 50 MB line's 25M words took 2 GB), and
    at most ``MAX_TEXT_TOKENS`` of them."""
    span = vocab - FIRST_ID
    ids = array("q")
    for n, m in enumerate(_WORDS.finditer(text)):
        if n >= MAX_TEXT_TOKENS:
            raise RequestLogError(f"line {line}: the prompt's text is longer than {MAX_TEXT_TOKENS:,} words, past "
                                  "any model's context; give prompt_token_ids, or cut the line")
        ids.append(FIRST_ID + xxhash.xxh64_intdigest(m.group().encode("utf-8", "surrogatepass")) % span)
    return tuple(ids)


def _messages_text(messages: Any, line: int) -> str:
    if not isinstance(messages, list) or not messages:
        raise RequestLogError(f"line {line}: messages must be a non-empty list of {{role, content}} objects")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            got = describe_value(m.get("content") if isinstance(m, dict) else m)
            raise RequestLogError(f"line {line}: messages[{i}] needs a string content (got {got}); "
                                  "content given as parts is not read, flatten it to text")
        role = m.get("role", "user")
        if not isinstance(role, str) or len(role) > 100:
            raise RequestLogError(f"line {line}: messages[{i}].role must be a short string, got {describe_value(role)}")
        parts.append(f"<{role}> {m['content']}")
    return "\n".join(parts)


def _prompt(rec: dict[str, Any], line: int, vocab: int, vocab_flag: str | None) -> tuple[tuple[int, ...], bool]:
    ids = rec.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t < vocab for t in ids):
            fix = f" (pass {vocab_flag} to match the model's)" if vocab_flag else ""
            raise RequestLogError(f"line {line}: prompt_token_ids must be a non-empty list of ints in [0, {vocab})"
                                  + fix)
        return tuple(ids), False
    if "messages" in rec:
        text = _messages_text(rec["messages"], line)
    elif isinstance(rec.get("prompt"), str) and rec["prompt"].strip():
        text = rec["prompt"]
    else:
        raise RequestLogError(f"line {line}: no prompt: give prompt_token_ids, prompt (text) or messages")
    tokens = stand_in_tokens(text, vocab, line)
    if not tokens:
        raise RequestLogError(f"line {line}: the prompt has no words to replay")
    return tokens, True


def _number(rec: dict[str, Any], key: str, line: int, high: float, why: str = "") -> float | None:
    v = rec.get(key)
    return None if v is None else number(v, f"line {line}: {key}", high, why=why)


def _object(raw: str, n: int) -> dict[str, Any]:
    rec = parse_json(raw, f"line {n}")
    if not isinstance(rec, dict):
        raise RequestLogError(f"line {n}: a request must be a JSON object, got {type(rec).__name__}")
    return rec


@dataclass(slots=True)
class BadLines:
    """Lines that are not a valid request, skipped up to ``allowed`` (a live log's last line is
    often cut short); past that, the next one is an error that names the option."""

    allowed: int = 0
    #: The caller's option that sets ``allowed`` (None: it has none, and errors do not name one).
    option: str | None = "--skip-bad-lines"
    skipped: list[str] = field(default_factory=list)

    def skip(self, exc: RequestLogError) -> None:
        if len(self.skipped) < self.allowed:
            self.skipped.append(str(exc))
            return
        if self.option is None:
            raise exc
        if self.allowed:
            raise RequestLogError(f"{exc} (bad line {self.allowed + 1}: past {self.option} {self.allowed})") from None
        raise RequestLogError(f"{exc} (or {self.option} N skips up to N bad lines)") from None

    def note(self) -> str | None:
        """One line for the report: how many were skipped and the first of them."""
        if not self.skipped:
            return None
        return f"note: skipped {len(self.skipped):,} bad line(s) (--skip-bad-lines); the first: {self.skipped[0]}"


def read_request_log(path: str | Path, vocab: int = 32000, limit: int | None = None,
                     vocab_flag: str | None = "--vocab", bad: BadLines | None = None) -> list[LoggedRequest]:
    """The log's requests in arrival order (by timestamp where the lines have one).
    ``vocab_flag``: the option that sets ``vocab`` for the caller (None: it has none); ``bad``:
    how many bad lines to skip, and those skipped (None: the first is an error)."""
    p = Path(path)
    if p.is_dir():
        raise RequestLogError(f"--log {path}: a directory; give a request log file (OpenAI-style JSONL) inside it")
    if not p.is_file():
        raise RequestLogError(f"--log {path}: no such file; give an OpenAI-style JSONL request log")
    out: list[LoggedRequest] = []
    bad = bad if bad is not None else BadLines(option=None)
    for n, raw in read_lines(p):  # plain or gzipped; a line past the length bound is never skipped
        try:
            out.append(_request(raw, n, vocab, vocab_flag))
        except RequestLogError as exc:
            bad.skip(exc)
            continue
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise RequestLogError(f"--log {path}: no requests in it")
    return _placed(out)


def _request(raw: str, n: int, vocab: int, vocab_flag: str | None) -> LoggedRequest:
    rec = _object(raw, n)
    body: dict[str, Any] = rec["body"] if isinstance(rec.get("body"), dict) else rec  # a batch-API line
    tokens, from_text = _prompt(body, n, vocab, vocab_flag)
    ts = _number(rec, "timestamp", n, MAX_TIMESTAMP)
    mt = _number(body, "max_tokens", n, MAX_TOKENS, "; a longer reply is beyond any model's context")
    duration = _number(rec, "duration_s", n, MAX_SECONDS)
    session = rec.get("session", rec.get("user", body.get("user")))
    if session is not None and not ((isinstance(session, str) and len(session) <= MAX_SESSION_CHARS)
                                    or (type(session) is int and session.bit_length() <= 64)):
        raise RequestLogError(f"line {n}: session must be a string of at most {MAX_SESSION_CHARS} characters, "
                              f"got {describe_value(session)}")
    return LoggedRequest(n, tokens, math.nan if ts is None else ts / 1000 if ts > 1e11 else ts,
                         None if session is None else str(session), None if mt is None else max(1, int(mt)),
                         from_text, duration)


def _placed(out: list[LoggedRequest]) -> list[LoggedRequest]:
    # A line without a timestamp arrives with the timed line before it (the first timed one, if
    # it comes before them all).
    timed = [r.t for r in out if not math.isnan(r.t)]
    t0 = min(timed, default=0.0)
    last = timed[0] if timed else 0.0
    placed = []
    for r in out:
        last = last if math.isnan(r.t) else r.t
        placed.append(LoggedRequest(r.line, r.tokens, last - t0, r.session, r.max_tokens, r.from_text, r.duration_s))
    return sorted(placed, key=lambda r: (r.t, r.line))
