"""Trace readers and synthetic generators: each request is a list of prefix block hashes.

Formats: Mooncake JSONL (``hash_ids`` are prefix hashes of
512-token blocks), WEKA Claude-Code JSON (64-token blocks, per-conversation hash ids), IBM ARC
``.lis`` page traces (one page per request: plain page-cache replay).
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.errors import describe_value
from kvoffload.log_lines import RequestLogError, number, parse_json, read_lines

#: The trace shipped with the package: the first 1,500 requests of Mooncake's conversation trace.
SAMPLE_TRACE = "mooncake-sample"
_SAMPLE_FILE = "mooncake_conversation_1500.jsonl.gz"
#: Where the traces too large to ship come from (named in the one-line error for each).
UPSTREAM = {
    "weka": "WEKA's Claude Code traces are not shipped with kvoffload: take traces/trace_*.json from "
            "github.com/callanjfox/kv-cache-tester (Apache-2.0), pack them in a .tar.gz and give its path",
    "mooncake": "the whole Mooncake conversation trace is not shipped with kvoffload (1,500 of its requests are: "
                "'mooncake-sample'): take FAST25-release/traces/conversation_trace.jsonl from "
                "github.com/kvcache-ai/Mooncake (Apache-2.0) and give its path",
}


def resolve_trace(value: str, flag: str = "--trace") -> Path:
    """A trace file by path, or ``mooncake-sample`` (shipped inside the package); a name of a
    trace that is not shipped (``weka``, ``mooncake``) is a ValueError saying where it comes
    from and which flag takes its path."""
    if value == SAMPLE_TRACE:
        from importlib import resources

        return Path(str(resources.files("kvoffload") / "examples" / "traces" / _SAMPLE_FILE))
    if value in UPSTREAM and not Path(value).exists():
        raise ValueError(f"{flag} {value}: {UPSTREAM[value]}: {flag} PATH")
    path = Path(value).expanduser()
    if not path.exists():
        raise ValueError(f"{flag} {value}: no such file; give a trace file's path or {SAMPLE_TRACE} (shipped)")
    return path


def load_mooncake(path: str | Path, limit: int | None = None) -> list[list[int]]:
    """Mooncake FAST'25 JSONL: ``hash_ids`` are already prefix (chained) block ids."""
    out: list[list[int]] = []
    for n, line in read_lines(Path(path)):
        rec = parse_json(line, f"{path} line {n}")
        ids = rec.get("hash_ids") if isinstance(rec, dict) else None
        if not isinstance(ids, list) or not all(type(h) is int for h in ids):
            raise RequestLogError(f"{path} line {n}: a Mooncake trace line needs hash_ids, a list of ints; got "
                                  f"{describe_value(ids)}")
        out.append(ids)
        if limit is not None and len(out) >= limit:
            break
    return out


def synthetic_prefix_workload(
    num_requests: int = 20_000,
    num_system_prompts: int = 20,
    system_blocks: int = 16,
    num_docs: int = 2_000,
    doc_blocks: int = 24,
    unique_blocks: int = 8,
    zipf_a: float = 1.1,
    seed: int = 0,
) -> list[list[int]]:
    """Shared system prompts + Zipf-popular documents + a unique tail, as chained ids."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** zipf_a for i in range(num_docs)]
    chain_ids: dict[tuple, int] = {}

    def chain(blocks: list[tuple]) -> list[int]:
        out: list[int] = []
        parent: tuple = ()
        for b in blocks:
            parent = (parent, b) if parent else (b,)
            out.append(chain_ids.setdefault(parent, len(chain_ids)))
        return out

    reqs = []
    for r in range(num_requests):
        sp = rng.randrange(num_system_prompts)
        doc = rng.choices(range(num_docs), weights)[0]
        blocks = [("s", sp, i) for i in range(system_blocks)]
        blocks += [("d", doc, i) for i in range(doc_blocks)]
        blocks += [("u", r, i) for i in range(unique_blocks)]
        reqs.append(chain(blocks))
    return reqs


def load_arc_lis(path: str | Path, limit: int | None = None) -> list[list[int]]:
    """IBM ARC traces: each line ``start n ...`` is n consecutive page refs (one request each)."""
    out: list[list[int]] = []
    for _, line in read_lines(Path(path)):
        parts = line.split()
        if len(parts) < 2:
            continue
        start, n = int(parts[0]), int(parts[1])
        for page in range(start, start + n):
            out.append([page])
            if limit is not None and len(out) >= limit:
                return out
    return out


def progress_bar(path: str | Path) -> Any:
    """A bytes-read progress bar for loading a large trace (shown on a terminal only)."""
    from tqdm import tqdm

    return tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, desc=f"loading {os.path.basename(path)}",
                disable=None, leave=False)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace with sessions: when (seconds, on the replay's interleaved
    clock), whose, how it ended (its own stop reason: ``tool_use``, ``end_turn``, or ``""``
    where the trace gives none) and its blocks."""

    t: float
    session: str
    stop: str
    blocks: list[int]


def load_weka(path: str | Path, limit: int | None = None, gap_s: float = 30.0) -> list[list[int]]:
    """WEKA kv-cache-tester traces (tar.gz of per-conversation JSON, 64-token blocks): the
    blocks of each request, in replay order (see ``load_weka_requests``)."""
    return [r.blocks for r in load_weka_requests(path, limit, gap_s)]


#: One conversation's trace file (the largest WEKA ones are a few MiB).
MAX_WEKA_MEMBER_BYTES = 256 << 20
#: Seconds past the conversation's start: beyond this (3,000 years) a time is corrupt.
MAX_WEKA_TIME_S = 1e11


def load_weka_requests(path: str | Path, limit: int | None = None, gap_s: float = 30.0) -> list[TraceRequest]:
    """WEKA's requests with their conversation (the session) and stop reason.

    Hash ids are local to a conversation, so each block is keyed by (trace id, hash id),
    interned to a dense int. Conversations are interleaved by their request times, each
    starting ``gap_s`` after the previous one (the traces carry no absolute timestamps); a
    sub-agent's requests belong to its conversation, at the sub-agent's start plus their own
    times (theirs count from the sub-agent's start, not the conversation's).

    A ``RequestLogError`` names the member and the field of anything else: an archive that is
    not a tar, a member too large or not a JSON object, a time that is not a finite number.
    """
    import tarfile

    timed: list[tuple[float, int, TraceRequest]] = []
    ids: dict[tuple[str, int], int] = {}  # (trace id, local hash) -> dense global id
    try:
        with open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r:gz") as tar, progress_bar(path) as bar:
            for k, member in enumerate(m for m in tar if m.isfile() and m.name.endswith(".json")):
                bar.update(raw.tell() - bar.n)  # compressed bytes read so far
                where = f"{path}: {member.name[:200]}"
                if member.size > MAX_WEKA_MEMBER_BYTES:
                    raise RequestLogError(f"{where}: {member.size:,} bytes, more than a conversation's trace "
                                          f"({MAX_WEKA_MEMBER_BYTES >> 20} MiB at most); remove it from the archive")
                f = tar.extractfile(member)
                if f is None:
                    continue
                trace = parse_json(f.read().decode("utf-8", "replace"), where)
                if not isinstance(trace, dict) or not isinstance(trace.get("requests", []), list):
                    raise RequestLogError(f"{where}: a WEKA trace is a JSON object with a list of requests, got "
                                          f"{describe_value(trace)}")
                tid = str(trace.get("id", member.name))[:200]
                offset = k * gap_s
                for at, req in _flatten_weka(trace.get("requests", []), where):
                    hashes = req.get("hash_ids", [])
                    if not isinstance(hashes, list) or not all(type(h) is int for h in hashes):
                        raise RequestLogError(f"{where}: hash_ids must be a list of ints, got {describe_value(hashes)}")
                    blocks = [ids.setdefault((tid, h), len(ids)) for h in hashes]
                    t = offset + at
                    stop = req.get("stop")
                    timed.append((t, len(timed), TraceRequest(t, tid, stop if isinstance(stop, str) else "", blocks)))
                if limit is not None and len(timed) >= limit:
                    break
    except tarfile.TarError as exc:
        raise RequestLogError(f"{path}: not a WEKA trace archive ({exc}); give the .tar.gz of trace_*.json") from None
    except (EOFError, zlib.error) as exc:
        raise RequestLogError(f"{path}: a damaged gzip file ({exc}); download or pack the archive again") from None
    timed.sort(key=lambda x: (x[0], x[1]))
    reqs = [r for _, _, r in timed]
    return reqs[:limit] if limit is not None else reqs


def _flatten_weka(requests: list[Any], where: str, start: float = 0.0, depth: int = 0) -> Iterator[tuple[float, dict]]:
    """(time since the conversation's start, request), sub-agents' requests included."""
    if depth > 100:
        raise RequestLogError(f"{where}: sub-agents nested more than 100 deep")
    for req in requests:
        if not isinstance(req, dict):
            raise RequestLogError(f"{where}: a request must be a JSON object, got {describe_value(req)}")
        at = start + number(req.get("t", 0.0), f"{where}: t", MAX_WEKA_TIME_S)
        if req.get("type") == "subagent" and "requests" in req:
            sub = req["requests"]
            if not isinstance(sub, list):
                raise RequestLogError(f"{where}: a sub-agent's requests must be a list, got {describe_value(sub)}")
            yield from _flatten_weka(sub, where, at, depth + 1)
        else:
            yield at, req


def synthetic_scan_workload(
    hot_blocks: int = 50, hot_repeats: int = 20, scan_blocks: int = 400, seed: int = 0
) -> list[list[int]]:
    """Hot single-block requests reused often, then a one-off scan, then the hot set again."""
    rng = random.Random(seed)
    hot = [[i] for i in range(hot_blocks)]
    reqs: list[list[int]] = []
    for _ in range(hot_repeats):
        reqs.extend(rng.sample(hot, len(hot)))
    reqs.extend([[10_000 + i] for i in range(scan_blocks)])
    reqs.extend(rng.sample(hot, len(hot)))
    return reqs
