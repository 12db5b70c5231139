"""Waiting for a server process to answer ``/health``: the one start-up poll every harness and
benchmark here shares (vLLM's API server, Dynamo's selection service, vllm-router)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable


class StartError(RuntimeError):
    """A server that exited or never answered at start-up (the reason, and its log's tail)."""


def answers(url: str, timeout_s: float = 5.0) -> bool:
    """``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def wait_healthy(base: str, proc: subprocess.Popen | None, what: str, timeout_s: float,
                 log_tail: Callable[[], str] = lambda: "", poll_s: float = 0.5) -> None:
    """Until ``base``/health answers: a StartError naming ``what`` when ``proc`` exits first
    (with its log's tail) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StartError(f"{what} exited ({proc.returncode}) at start-up: {log_tail()}")
        if answers(f"{base}/health"):
            return
        time.sleep(poll_s)
    raise StartError(f"{what} did not answer {base}/health within {timeout_s:.0f} s: {log_tail()}")
