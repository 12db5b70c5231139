"""The request log of a served workload, as a user's server would have kept it: one OpenAI-style
JSONL line per request (``prompt_token_ids``, ``timestamp`` when it was sent, ``session``,
``max_tokens``, ``duration_s`` until its last token), so ``kvoffload plan`` can be checked against the run that made it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvoffload.bench.serve_workloads import Workload


def prompts_of(wl: Workload, turns: Sequence[tuple[str, int, Any]]) -> dict[tuple[str, int], list[int]]:
    """Each request's prompt, rebuilt from its session and the answers before it."""
    answers = {(sid, turn): c.tokens.get(0, []) for sid, turn, c in turns}
    out: dict[tuple[str, int], list[int]] = {}
    for s in wl.sessions:
        history = list(s.prefix)
        for t in range(len(s.turns)):
            if (s.sid, t) not in answers:
                break
            prompt = s.prompt(t, history)
            out[(s.sid, t)] = prompt
            history = prompt + answers[(s.sid, t)]
    return out


def write_served_log(wl: Workload, turns: Sequence[tuple[str, int, Any]], path: str | Path) -> int:
    """Write the log in sending order; returns the number of requests written."""
    prompts = prompts_of(wl, turns)
    rows = sorted(((c.start, sid, turn, c.times[-1] if c.times else 0.0) for sid, turn, c in turns),
                  key=lambda r: r[0])
    with open(path, "w", encoding="utf-8") as f:
        for start, sid, turn, duration in rows:
            f.write(json.dumps({"timestamp": round(start, 6), "session": sid, "max_tokens": wl.max_tokens,
                                "duration_s": round(duration, 6), "prompt_token_ids": prompts[(sid, turn)]}) + "\n")
    return len(rows)


def model_beside(log: str | Path) -> Path:
    """Where ``bench serve --write-log`` keeps the served model's config.json: ``LOG-model/``
    beside the log (the bench's own model directory is temporary, and ``plan --model`` needs it)."""
    p = Path(log)
    return p.with_name(p.name.split(".")[0] + "-model")


def save_first_run(args: Any, wl: Workload, first: Any) -> str:
    """``bench serve --write-log``: the first configuration's first run as a log, and the model's
    config.json beside it where the bench made the model up; the line to print."""
    from kvoffload.bench.dummy_model import write_model_of

    n = write_served_log(wl, [(t.sid, t.turn, t.completion) for t in first.turns], args.write_log)
    model = args.model or model_beside(args.write_log)
    if args.model is None:
        write_model_of(Path(model), args)
    return (f"request log of the first {first.config} run ({n} requests): {args.write_log}; the model it served: "
            f"{model} (kvoffload plan --log {args.write_log} --model {model} ...)")
