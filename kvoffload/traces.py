"""Trace readers and a synthetic generator: each request is a list of prefix block hashes."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from pathlib import Path


def _open_text(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def load_mooncake(path: str | Path, limit: int | None = None) -> list[list[int]]:
    """Mooncake FAST'25 JSONL: ``hash_ids`` are already prefix (chained) block ids."""
    out: list[list[int]] = []
    with _open_text(Path(path)) as f:
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
        out, parent = [], ()
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


def iter_blocks(requests: list[list[int]]) -> Iterator[int]:
    for req in requests:
        yield from req
