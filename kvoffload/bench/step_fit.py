"""What a step computed and what it cost, fitted into an engine's speed: shared by ``bench
profile``'s two engines (the bundled one's steps recorded by its StepRecorder, vLLM's by
``vllm_steps``)."""

from __future__ import annotations

import numpy as np

from kvoffload.plan.profile import EngineSpeed

#: Prompt lengths of the profiling load (each several times, arriving a few at a time).
LENGTHS = (16, 64, 256, 512, 1024, 2048)
#: Step terms the engine's speed is fitted on, in EngineSpeed's names.
TERMS = ("step_s", "token_s", "attention_s", "decode_s", "decode_context_s", "load_step_s")


def step_terms(parts: list[tuple[int, int, bool]], loads: int = 0) -> dict[str, float]:
    """One step's regressors: its prefill tokens, their attention, its decodes and their context,
    and the loads it sent off or took back."""
    prefill = [(n, c) for n, c, decode in parts if not decode]
    decodes = [c for _, c, decode in parts if decode]
    return {"step_s": 1.0, "token_s": float(sum(n for n, _ in prefill)),
            "attention_s": float(sum(n * (c + n / 2) for n, c in prefill)),
            "decode_s": float(len(decodes)), "decode_context_s": float(sum(decodes)), "load_step_s": float(loads)}


def fit_steps(rows: list[tuple[dict[str, float], float]], mbt: int, model: str) -> EngineSpeed:
    """Least squares over steps (terms, seconds); a term that fits negative is dropped and the
    rest refitted, so every speed is >= 0."""
    y = np.array([t for _, t in rows])
    keep = list(TERMS)
    while True:
        a = np.array([[terms[k] for k in keep] for terms, _ in rows])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    got = {k: float(v) for k, v in zip(keep, np.maximum(coef, 0.0))}
    return EngineSpeed(model, got.get("step_s", 0.0), got.get("token_s", 0.0) or 1e-9, got.get("attention_s", 0.0),
                       mbt, got.get("decode_s", 0.0), got.get("decode_context_s", 0.0),
                       load_step_s=got.get("load_step_s", 0.0))
