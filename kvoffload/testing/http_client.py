"""One streaming completion against an OpenAI-compatible server, timed token by token.

Token-id prompts (``/v1/completions`` with ``"prompt": [ids]`` and ``return_token_ids``), so
no tokenizer is needed on either side. A client may disconnect after ``abort_after_s``: the
connection is closed mid-stream, which is how vLLM learns of a client abort.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Completion:
    """What one request saw: tokens per choice, when they came, how it ended."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    start: float = 0.0
    #: Arrival time of every streamed token (all choices), relative to ``start``.
    times: list[float] = field(default_factory=list)
    cached_tokens: int | None = None
    status: int = 0
    error: str = ""
    aborted: bool = False
    #: The replica a routing gateway sent it to (its ``x-kvoffload-worker`` header), if any.
    worker: int | None = None
    #: What the router saw cached of the prompt on each replica when it chose, in blocks (the
    #: gateway's ``x-kvoffload-seen`` header; None without one).
    seen: dict[int, int] | None = None
    #: Milliseconds the gateway took to choose the replica (``x-kvoffload-route-ms``), if it said.
    route_ms: float | None = None

    @property
    def ttft(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def inter_token(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]

    @property
    def ok(self) -> bool:
        return not self.aborted and not self.error and self.status == 200 and "error" not in self.finish.values()


def worker_id(header: str | None) -> int | None:
    """The replica id a gateway named, or None (absent, or not a small integer: never trusted further)."""
    if header is None or not (header.isascii() and header.isdigit()) or len(header) > 9:
        return None
    return int(header)


def route_ms(header: str | None) -> float | None:
    """The gateway's ``x-kvoffload-route-ms``: a finite millisecond count under a day, else None."""
    if header is None or len(header) > 16 or not header.isascii():
        return None
    try:
        ms = float(header)
    except ValueError:
        return None
    return ms if 0 <= ms < 86_400_000 else None


def seen_blocks(header: str | None) -> dict[int, int] | None:
    """``ID=DEVICE/HOST/DISK,...`` as blocks per replica (the three summed); None if absent or
    malformed anywhere (a header is trusted only as small integers, at most 64 replicas)."""
    if header is None or len(header) > 2048 or not header.isascii():
        return None
    out: dict[int, int] = {}
    for part in header.split(",")[:65]:
        wid, sep, counts = part.partition("=")
        nums = counts.split("/")
        if not sep or worker_id(wid) is None or len(nums) != 3 or not all(n.isdigit() and len(n) <= 9 for n in nums):
            return None
        out[int(wid)] = sum(int(n) for n in nums)
    return out if 0 < len(out) <= 64 else None


async def stream_completion(session: Any, url: str, model: str, prompt: list[int], max_tokens: int,
                            abort_after_s: float | None = None, n: int = 1, seed: int | None = None,
                            timeout_s: float = 300.0, kv_transfer_params: dict[str, Any] | None = None,
                            user: str | None = None) -> Completion:
    """POST one streaming completion; greedy unless ``seed`` is given (sampled, reproducible);
    ``user``: OpenAI's end-user field (a routing gateway may keep a conversation's replica by it)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                            "return_token_ids": True, "n": n, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    if user is not None:
        body["user"] = user
    if seed is None:
        body["temperature"] = 0.0
    else:
        body.update(temperature=1.0, seed=seed)
    out = Completion(start=time.perf_counter())
    try:
        task = asyncio.ensure_future(_read(session, f"{url}/v1/completions", body, out))
        if abort_after_s is None:
            await asyncio.wait_for(task, timeout_s)
        else:
            done, _ = await asyncio.wait({task}, timeout=abort_after_s)
            if not done:
                task.cancel()  # closes the connection mid-stream: vLLM aborts the request
                out.aborted = True
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            else:
                task.result()
    except asyncio.TimeoutError:
        out.error = f"no complete answer within {timeout_s:.0f} s"
    except Exception as exc:  # noqa: BLE001 - a refused or reset connection is a result, not a crash
        out.error = f"{type(exc).__name__}: {exc}"
    return out


async def _read(session: Any, url: str, body: dict[str, Any], out: Completion) -> None:
    async with session.post(url, json=body) as resp:
        out.status = resp.status
        out.worker = worker_id(resp.headers.get("x-kvoffload-worker"))
        out.seen = seen_blocks(resp.headers.get("x-kvoffload-seen"))
        out.route_ms = route_ms(resp.headers.get("x-kvoffload-route-ms"))
        if resp.status != 200:
            out.error = (await resp.text())[:300]
            return
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:
                out.error = str(chunk["error"])[:300]
                return
            now = time.perf_counter() - out.start
            for choice in chunk.get("choices") or ():
                ids = choice.get("token_ids") or []
                out.tokens.setdefault(choice["index"], []).extend(ids)
                out.times.extend([now] * len(ids))
                if choice.get("finish_reason") is not None:
                    out.finish[choice["index"]] = choice["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                details = usage.get("prompt_tokens_details") or {}
                out.cached_tokens = details.get("cached_tokens") or 0
