"""Trace readers and synthetic generators: each request is a list of prefix block hashes.

Formats: Mooncake JSONL (``hash_ids`` are prefix hashes of
512-token blocks), WEKA Claude-Code JSON (64-token blocks, per-conversation hash ids), IBM ARC
``.lis`` page traces (one page per request: plain page-cache replay).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

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


def open_text(path: Path) -> TextIO:
    """A text log, gzipped (``.gz``) or plain, read as UTF-8."""
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def load_mooncake(path: str | Path, limit: int | None = None) -> list[list[int]]:
    """Mooncake FAST'25 JSONL: ``hash_ids`` are already prefix (chained) block ids."""
    out: list[list[int]] = []
    with open_text(Path(path)) as f:
        for line in f:
            if line.strip():
                out.append(list(json.loads(line)["hash_ids"]))
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
    with open_text(Path(path)) as f:
        for line in f:
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


def load_weka_requests(path: str | Path, limit: int | None = None, gap_s: float = 30.0) -> list[TraceRequest]:
    """WEKA's requests with their conversation (the session) and stop reason.

    Hash ids are local to a conversation, so each block is keyed by (trace id, hash id),
    interned to a dense int. Conversations are interleaved by their request times, each
    starting ``gap_s`` after the previous one (the traces carry no absolute timestamps); a
    sub-agent's requests belong to its conversation, at the sub-agent's start plus their own
    times (theirs count from the sub-agent's start, not the conversation's).
    """
    import tarfile

    timed: list[tuple[float, int, TraceRequest]] = []
    ids: dict[tuple[str, int], int] = {}  # (trace id, local hash) -> dense global id
    with open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r:gz") as tar, progress_bar(path) as bar:
        for k, member in enumerate(m for m in tar if m.isfile() and m.name.endswith(".json")):
            bar.update(raw.tell() - bar.n)  # compressed bytes read so far
            f = tar.extractfile(member)
            if f is None:
                continue
            trace = json.load(f)
            tid = str(trace.get("id", member.name))
            offset = k * gap_s
            for at, req in _flatten_weka(trace.get("requests", [])):
                blocks = [ids.setdefault((tid, h), len(ids)) for h in req.get("hash_ids", [])]
                t = offset + at
                timed.append((t, len(timed), TraceRequest(t, tid, str(req.get("stop") or ""), blocks)))
            if limit is not None and len(timed) >= limit:
                break
    timed.sort(key=lambda x: (x[0], x[1]))
    reqs = [r for _, _, r in timed]
    return reqs[:limit] if limit is not None else reqs


def _flatten_weka(requests: list[dict], start: float = 0.0) -> Iterator[tuple[float, dict]]:
    """(time since the conversation's start, request), sub-agents' requests included."""
    for req in requests:
        at = start + float(req.get("t", 0.0))
        if req.get("type") == "subagent" and "requests" in req:
            yield from _flatten_weka(req["requests"], at)
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
