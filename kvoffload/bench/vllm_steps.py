"""vLLM's own step times on ``bench profile``'s load, for `kvoffload plan` to price a vLLM
server: the engine runs offline in this one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with
the server's settings, its scheduler's output is read for what each step computed and
``LLMEngine.step`` is timed. Run as ``python -m kvoffload.bench.vllm_steps SETTINGS_JSON`` with
vLLM's python: it prints ``ROWS`` and the JSON of (step terms, seconds) per step."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import Any

from kvoffload.bench.step_fit import LENGTHS, fit_steps, step_terms
from kvoffload.plan.profile import EngineSpeed


def _lengths(max_model_len: int) -> list[int]:
    """bench profile's prompt lengths that fit the server's context with room for the mixed load."""
    return [n for n in LENGTHS if n + 24 + 64 + 24 < max_model_len] or [max_model_len // 4]


def record(model: str, engine: dict[str, Any], reps: int, vocab: int) -> list[tuple[dict[str, float], float]]:
    """The rows of ``reps`` rounds of the load: prompts alone, then four at a time, each decoding
    24 tokens and returning once with 64 tokens more (as bench profile times the bundled engine)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, enforce_eager=True, seed=0, **engine)
    core = llm.llm_engine.engine_core.engine_core  # the in-process EngineCore
    prompt_len: dict[str, int] = {}
    current: list[tuple[int, int, bool]] = []
    schedule = core.scheduler.schedule

    def noted_schedule(*args: Any, **kwargs: Any) -> Any:
        so = schedule(*args, **kwargs)
        computed = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
        for r in so.scheduled_new_reqs:
            prompt_len[r.req_id] = len(r.prompt_token_ids or ())
        computed.update(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        current[:] = [(n, computed[rid], computed[rid] >= prompt_len.get(rid, 0))
                      for rid, n in so.num_scheduled_tokens.items() if n > 0]
        return so

    core.scheduler.schedule = noted_schedule
    engine_step = llm.llm_engine.step
    rows: list[tuple[dict[str, float], float]] = []

    def step() -> list[Any]:
        current.clear()
        t0 = time.perf_counter()
        outs = engine_step()
        if current:
            rows.append((step_terms(list(current)), time.perf_counter() - t0))
        return [o for o in outs if o.finished]

    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(n)]

    lengths = _lengths(int(engine.get("max_model_len", 2048)))
    llm.generate([{"prompt_token_ids": prompt(64)}], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    ids = iter(range(1 << 30))

    def add(p: list[int], max_tokens: int) -> str:
        rid = f"p{next(ids)}"
        llm.llm_engine.add_request(rid, {"prompt_token_ids": p}, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return rid

    for n in lengths * reps:  # prefill alone
        add(prompt(n), 1)
        while not step():
            pass
    queue = [prompt(n) for n in lengths * reps]
    rng.shuffle(queue)
    running: dict[str, tuple[list[int], bool]] = {}
    while queue or running:
        while queue and len(running) < 4:
            p = queue.pop()
            running[add(p, 24)] = (p, len(p) in lengths)
        for out in step():
            p, fresh = running.pop(out.request_id)
            if fresh:  # it returns: its answer and 64 new tokens after its prompt
                queue.insert(0, p + list(out.outputs[0].token_ids) + prompt(64))
    return rows


def vllm_engine_speed(model: str, engine: dict[str, Any], reps: int, vocab: int, env: dict[str, str]) -> EngineSpeed:
    """The fit of vLLM's step times (``engine``: the server's LLM settings, ``max_num_batched_tokens``
    among them; ``env``: the server's environment), recorded in a child process with this python."""
    settings = {"model": model, "engine": engine, "reps": reps, "vocab": vocab}
    proc = subprocess.run([sys.executable, "-m", "kvoffload.bench.vllm_steps", json.dumps(settings)],
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    rows = next((json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("ROWS ")), None)
    if rows is None:
        raise RuntimeError(f"timing vLLM's steps failed (rc={proc.returncode}): {proc.stderr[-3000:]}")
    return fit_steps(rows, int(engine["max_num_batched_tokens"]), model)


if __name__ == "__main__":
    settings = json.loads(sys.argv[1])
    result = record(settings["model"], settings["engine"], int(settings["reps"]), int(settings["vocab"]))
    print("ROWS " + json.dumps(result), flush=True)
