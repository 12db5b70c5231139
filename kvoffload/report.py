"""Summaries of an engine run, for the CLI and benchmarks."""

from __future__ import annotations

from typing import Any


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(stats: dict[str, Any], wall_s: float) -> dict[str, Any]:
    hits = stats["prefix_hit_tokens"]
    prompt = stats["prompt_tokens"]
    saved = prompt - stats["prefill_tokens_computed"]
    ttft = stats["ttft_s"]
    return {
        "requests": stats["requests"],
        "prompt tokens": prompt,
        "generated tokens": stats["generated_tokens"],
        "prefix hits (device)": hits.get("device", 0),
        "prefix hits (cpu)": hits.get("cpu", 0),
        "prefix hits (disk)": hits.get("disk", 0),
        **{f"prefix hits ({tier})": n for tier, n in hits.items() if tier not in ("device", "cpu", "disk")},
        # Of each prompt, the tokens found cached when it was first admitted (re-admissions
        # after preemption hit again and would count twice).
        "prefix-cache hit rate": f"{stats['prompt_hit_tokens'] / prompt:.1%}" if prompt else "n/a",
        "prefill tokens computed": stats["prefill_tokens_computed"],
        "prefill tokens saved": max(saved, 0),
        **{f"{tier} blocks recovered at start": n for tier, n in stats["connector"].get("tier_blocks_recovered", {}).items()
           if n},
        "preemptions": stats["preemptions"],
        "tokens swapped out": stats.get("swapped_out_tokens", 0),
        "recomputed after preemption": stats.get("recomputed_after_preemption", 0),
        "blocks swapped out/in": f"{stats['connector'].get('swapped_out_blocks', 0)}/"
                                 f"{stats['connector'].get('swapped_in_blocks', 0)}",
        "TTFT p50 (ms)": f"{1000 * percentile(ttft, 0.5):.1f}",
        "TTFT p95 (ms)": f"{1000 * percentile(ttft, 0.95):.1f}",
        # Every prompt token (computed or hit) and generated token, over the run's wall time.
        "tokens/s (prompt+generated)": f"{(prompt + stats['generated_tokens']) / wall_s:.0f}" if wall_s else "n/a",
        "wall time (s)": f"{wall_s:.2f}",
    }


def format_table(columns: dict[str, dict[str, Any]]) -> str:
    """Rows = metric names, one column per run."""
    names = list(columns)
    keys: list[str] = []
    for col in columns.values():  # a row only some runs have goes after its predecessor there
        previous = None
        for k in col:
            if k not in keys:
                keys.insert(keys.index(previous) + 1 if previous is not None else len(keys), k)
            previous = k
    width = max(len(k) for k in keys) + 2
    colw = [max(len(n), *(len(str(columns[n].get(k, ""))) for k in keys)) + 2 for n in names]
    lines = [" " * width + "".join(n.rjust(w) for n, w in zip(names, colw))]
    for k in keys:
        lines.append(k.ljust(width) + "".join(str(columns[n].get(k, "")).rjust(w) for n, w in zip(names, colw)))
    return "\n".join(lines)

