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

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from kvoffload.traces import open_text

#: A reply longer than this is a broken log line, not a request.
MAX_TOKENS = 10_000_000
#: Token ids below this are left to the model's special tokens.
FIRST_ID = 10
_WORDS = re.compile(r"\w+|[^\w\s]")


class RequestLogError(ValueError):
    """A line of a request log that cannot be replayed (its number, field and the fix)."""


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


def stand_in_tokens(text: str, vocab: int) -> tuple[int, ...]:
    """Words and punctuation of ``text``, each hashed into ``[FIRST_ID, vocab)``."""
    span = vocab - FIRST_ID
    return tuple(FIRST_ID + xxhash.xxh64_intdigest(w.encode("utf-8", "surrogatepass")) % span
                 for w in _WORDS.findall(text))


def _messages_text(messages: Any, line: int) -> str:
    if not isinstance(messages, list) or not messages:
        raise RequestLogError(f"line {line}: messages must be a non-empty list of {{role, content}} objects")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise RequestLogError(f"line {line}: messages[{i}] needs a string content (got {str(m)[:60]!r}); "
                                  "content given as parts is not read, flatten it to text")
        parts.append(f"<{m.get('role', 'user')}> {m['content']}")
    return "\n".join(parts)


def _prompt(rec: dict[str, Any], line: int, vocab: int) -> tuple[tuple[int, ...], bool]:
    ids = rec.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t < vocab for t in ids):
            raise RequestLogError(f"line {line}: prompt_token_ids must be a non-empty list of ints in [0, {vocab}) "
                                  "(pass --vocab to match the model's)")
        return tuple(ids), False
    if "messages" in rec:
        text = _messages_text(rec["messages"], line)
    elif isinstance(rec.get("prompt"), str) and rec["prompt"].strip():
        text = rec["prompt"]
    else:
        raise RequestLogError(f"line {line}: no prompt: give prompt_token_ids, prompt (text) or messages")
    tokens = stand_in_tokens(text, vocab)
    if not tokens:
        raise RequestLogError(f"line {line}: the prompt has no words to replay")
    return tokens, True


def _number(rec: dict[str, Any], key: str, line: int) -> float | None:
    v = rec.get(key)
    if v is None:
        return None
    if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
        raise RequestLogError(f"line {line}: {key} must be a finite number >= 0, got {v!r}")
    return float(v)


def read_request_log(path: str | Path, vocab: int = 32000, limit: int | None = None) -> list[LoggedRequest]:
    """The log's requests in arrival order (by timestamp where the lines have one)."""
    p = Path(path)
    if not p.is_file():
        raise RequestLogError(f"--log {path}: no such file; give an OpenAI-style JSONL request log")
    out: list[LoggedRequest] = []
    with open_text(p) as f:  # plain or gzipped
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise RequestLogError(f"line {n}: not JSON ({exc.msg} at column {exc.colno}); one object a line") from None
            if not isinstance(rec, dict):
                raise RequestLogError(f"line {n}: a request must be a JSON object, got {type(rec).__name__}")
            body: dict[str, Any] = rec["body"] if isinstance(rec.get("body"), dict) else rec  # a batch-API line
            tokens, from_text = _prompt(body, n, vocab)
            ts = _number(rec, "timestamp", n)
            mt = _number(body, "max_tokens", n)
            if mt is not None and mt > MAX_TOKENS:
                raise RequestLogError(f"line {n}: max_tokens {mt:g} is beyond any model's context; give at most "
                                      f"{MAX_TOKENS:,}")
            duration = _number(rec, "duration_s", n)
            session = rec.get("session", rec.get("user", body.get("user")))
            if session is not None and not isinstance(session, str | int):
                raise RequestLogError(f"line {n}: session must be a string, got {type(session).__name__}")
            out.append(LoggedRequest(n, tokens, math.nan if ts is None else ts / 1000 if ts > 1e11 else ts,
                                     None if session is None else str(session),
                                     None if mt is None else max(1, int(mt)), from_text, duration))
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise RequestLogError(f"--log {path}: no requests in it")
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
