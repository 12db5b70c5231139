"""A real ``vllm serve`` on a free loopback port, for the serving benchmark and the HTTP chaos
run: started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script looks
for a package named ``vllm``), waited for on ``/health``, scraped on ``/metrics``, stopped with
its engine processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from kvoffload.testing.health import StartError, answers, wait_healthy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """``with VllmServer(model, log_path, kv_transfer_config=...) as server: server.url``."""

    def __init__(self, model: str, log_path: str | os.PathLike[str], kv_transfer_config: dict[str, Any] | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 start_timeout_s: float = 400.0, gpu_memory_utilization: float = 0.1,
                 cpus: set[int] | None = None) -> None:
        self.model = model
        #: The cores the server and every process it starts may run on (None: any; where the
        #: platform can bind processes). vLLM's CPU build binds only its compute threads
        #: (VLLM_CPU_OMP_THREADS_BIND); its engine-core process (scheduler, connector, KV
        #: events) floated onto the other replica's core and took up to a fifth of it, so one
        #: replica computed the same run 2.4x slower.
        self.cpus = cpus
        self.log_path = Path(log_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(self.port),
                "--host", "127.0.0.1", "--skip-tokenizer-init", "--enforce-eager", "--seed", "0",
                "--enable-prompt-tokens-details", "--gpu-memory-utilization", str(gpu_memory_utilization),
                *(extra_args or [])]
        if kv_transfer_config is not None:
            args += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
        self.args = args
        self.env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def attach(cls, url: str, model: str = "") -> VllmServer:
        """A server someone else runs: requests and scrapes only (``model``: asked of
        ``/v1/models`` when empty)."""
        server = cls.__new__(cls)
        server.url, server.proc, server.log_path, server.args = url.rstrip("/"), None, Path("/dev/null"), []
        if not model:
            with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as resp:
                model = json.loads(resp.read())["data"][0]["id"]
        server.model = model
        return server

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        log = open(self.log_path, "wb")  # noqa: SIM115 - the server writes it until stop()
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)  # its own group: stop() ends the engine too
        log.close()
        # Before it starts any process (the imports alone take seconds): they inherit it. A
        # platform without CPU affinity (macOS) runs it unbound.
        if self.cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(self.proc.pid, self.cpus)
        def errors() -> str:  # the lines that name what went wrong, else the log's tail
            found = [line for line in self.log_tail(200_000).splitlines() if "Error:" in line][-3:]
            return f"(log: {self.log_path})\n" + "\n".join(found or [self.log_tail()])

        try:
            wait_healthy(self.url, self.proc, "vllm serve", self.start_timeout_s, errors, poll_s=1)
        except StartError:
            self.stop()
            raise

    def healthy(self) -> bool:
        return answers(f"{self.url}/health")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.healthy()

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 120) -> dict[str, Any]:
        req = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
        out: dict[str, Any] = json.loads(text) if text.strip() else {}
        return out

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of ``/metrics`` by (name, labels without engine and model_name)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # the engine processes share its group: none outlives it
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
