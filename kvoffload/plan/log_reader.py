"""A request log in any form a plan reads, as the blocks each request brings.

- OpenAI-style JSONL (``prompt_token_ids``, ``prompt`` or ``messages``; see
  ``kvoffload.plan.request_log``): token ids are hashed into blocks of ``block_size`` exactly as
  the engine hashes them; text goes through the documented stand-in tokenizer first.
- Mooncake JSONL (``hash_ids``: prefix ids of 512-token blocks; ``timestamp`` in ms).
- WEKA's Claude-Code traces (``.tar.gz`` of per-conversation JSON, 64-token blocks).

A request of a session also brings the blocks its reply fills (the engine stores them as it
generates): the next request of the same session shows them, as far as this prompt plus the
reply's tokens reach.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

from kvoffload.engine.hashing import hash_request_blocks
from kvoffload.errors import describe_value
from kvoffload.log_lines import number, parse_json, read_lines
from kvoffload.plan.request_log import MAX_TIMESTAMP, BadLines, RequestLogError, read_request_log

#: ``--log sample``: a small chat log shipped with kvoffload (8 chats x 3 turns, two shared system prompts).
SAMPLE_LOG = "sample"
MOONCAKE_BLOCK_TOKENS = 512
WEKA_BLOCK_TOKENS = 64
#: A prompt longer than this is a broken line (the longest contexts are a few million tokens).
MAX_PROMPT_TOKENS = 100_000_000


@dataclass(slots=True)
class PlanRequest:
    t: float
    session: str | None
    #: The prompt's blocks a hit may cover, in order (prefix keys: equal keys, equal prefixes).
    blocks: list[Hashable]
    prompt_tokens: int
    #: Blocks the engine stores for this request: the prompt's and its reply's full ones.
    stored: list[Hashable]
    #: The session's request before this one, whose answer it waited for (index in the log;
    #: -1: none, or its answer's time is not logged), and how long after that answer it came.
    after: int = -1
    think_s: float = 0.0
    #: The reply's length where the log gives it (``max_tokens``).
    output_tokens: int | None = None


@dataclass(slots=True)
class RequestLog:
    requests: list[PlanRequest]
    block_tokens: int
    form: str
    #: The prompts were text, tokenized by the stand-in (token counts are words).
    stand_in: bool = False

    @property
    def duration_s(self) -> float:
        return self.requests[-1].t - self.requests[0].t if self.requests else 0.0


def detect_form(path: Path) -> str:
    if path.name.endswith((".tar.gz", ".tgz")):
        return "weka"
    for _, line in read_lines(path):
        try:
            first = json.loads(line)
        except (ValueError, RecursionError):
            return "openai"  # its reader names the line and the fault
        return "mooncake" if isinstance(first, dict) and "hash_ids" in first else "openai"
    return "openai"


def sample_path(path: str | Path) -> str | Path:
    """``sample`` (where no such file is here) is the log shipped with kvoffload."""
    if str(path) == SAMPLE_LOG and not Path(path).exists():
        from importlib import resources

        return str(resources.files("kvoffload") / "examples" / "plan" / "sample.jsonl")
    return path


def read_log(path: str | Path, block_size: int, vocab: int = 32000, output_tokens: int = 128,
             limit: int | None = None, bad: BadLines | None = None) -> RequestLog:
    p = Path(sample_path(path))
    if p.is_dir():
        raise RequestLogError(f"--log {path}: a directory; give a request log file inside it")
    if not p.is_file():
        raise RequestLogError(f"--log {path}: no such file; give a request log (OpenAI-style JSONL, a Mooncake "
                              f"trace or WEKA's .tar.gz), or {SAMPLE_LOG} (shipped)")
    form = detect_form(p)
    if form == "weka":
        return _weka(p, limit)
    if form == "mooncake":
        return _mooncake(p, limit, bad or BadLines(option=None))
    return _openai(p, block_size, vocab, output_tokens, limit, bad)


def _openai(p: Path, block_size: int, vocab: int, output_tokens: int, limit: int | None,
            bad: BadLines | None) -> RequestLog:
    logged = read_request_log(p, vocab=vocab, limit=limit, vocab_flag=None, bad=bad)  # plan hashes any id
    full: list[list[Hashable]] = [list(hash_request_blocks(r.tokens, block_size)) for r in logged]
    # A hit leaves the engine the prompt's last token to compute: a block-aligned prompt's last
    # block is never loaded.
    reqs = [PlanRequest(r.t, r.session, f[: (len(r.tokens) - 1) // block_size], len(r.tokens), list(f),
                        output_tokens=r.max_tokens) for r, f in zip(logged, full)]
    # The reply's blocks: what the session's next prompt holds past this one, as far as this
    # prompt and the reply's tokens (max_tokens, else output_tokens) reach. The engine computes
    # every token but the last one it generates.
    last: dict[str, int] = {}
    for i, r in enumerate(logged):
        if r.session is None:
            continue
        j = last.get(r.session)
        last[r.session] = i
        if j is None:
            continue
        done = logged[j].duration_s
        if done is not None and r.t >= logged[j].t + done - 1e-3:  # sent after the answer: it waited
            reqs[i].after, reqs[i].think_s = j, max(0.0, r.t - (logged[j].t + done))
        n = len(full[j])
        if full[i][:n] != full[j]:
            continue  # not a continuation (the client rewrote its history)
        reach = (len(logged[j].tokens) + (logged[j].max_tokens or output_tokens) - 1) // block_size
        reqs[j].stored = full[i][:max(n, reach)]
    return RequestLog(reqs, block_size, "openai", any(r.from_text for r in logged))


def _mooncake_line(rec: object, n: int) -> tuple[list[int], float, int]:
    """(hash ids, arrival in seconds, prompt tokens) of one Mooncake line."""
    where = f"line {n}"
    if not isinstance(rec, dict):
        raise RequestLogError(f"{where}: a Mooncake trace line is a JSON object, got {type(rec).__name__}")
    ids = rec.get("hash_ids")
    if not isinstance(ids, list) or not all(type(h) is int for h in ids):
        raise RequestLogError(f"{where}: a Mooncake trace line needs hash_ids (a list of ints), timestamp (ms) and "
                              f"input_length; got hash_ids {describe_value(ids)}: fix or drop the line")
    ts = number(rec.get("timestamp", 0), f"{where}: timestamp (ms)", MAX_TIMESTAMP)
    length = number(rec.get("input_length", len(ids) * MOONCAKE_BLOCK_TOKENS), f"{where}: input_length",
                    MAX_PROMPT_TOKENS)
    return ids, ts / 1000.0, int(length)


def _mooncake(p: Path, limit: int | None, bad: BadLines) -> RequestLog:
    reqs = []
    for n, line in read_lines(p):
        try:
            ids, ts, length = _mooncake_line(parse_json(line, f"line {n}"), n)
        except RequestLogError as exc:
            bad.skip(exc)
            continue
        full = ids[: length // MOONCAKE_BLOCK_TOKENS] if length else ids
        reqs.append(PlanRequest(ts, None, list(full), max(length, 1), list(full)))
        if limit is not None and len(reqs) >= limit:
            break
    if not reqs:
        raise RequestLogError(f"--log {p}: no requests in it")
    t0 = min(r.t for r in reqs)
    for r in reqs:
        r.t -= t0
    reqs.sort(key=lambda r: r.t)
    return RequestLog(reqs, MOONCAKE_BLOCK_TOKENS, "mooncake")


def _weka(p: Path, limit: int | None) -> RequestLog:
    from kvoffload.traces import load_weka_requests

    try:
        trace = load_weka_requests(p, limit)
    except RequestLogError:
        raise
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise RequestLogError(f"--log {p}: not a WEKA trace archive ({str(exc)[:200]}); give the .tar.gz of "
                              "trace_*.json") from None
    if not trace:
        raise RequestLogError(f"--log {p}: no requests in it")
    reqs = []
    for r in trace:
        blocks: list[Hashable] = list(r.blocks)
        reqs.append(PlanRequest(r.t, r.session, blocks, max(1, len(blocks) * WEKA_BLOCK_TOKENS), blocks))
    return RequestLog(reqs, WEKA_BLOCK_TOKENS, "weka")
