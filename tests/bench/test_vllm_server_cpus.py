"""``VllmServer(cpus=...)``: the server and every process it starts later run on those cores
only (vLLM's CPU build binds its compute threads alone; its engine-core process floated onto
another replica's core). A stand-in server: it waits, starts a child that records its cores,
and answers /health."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kvoffload.testing.vllm_server import VllmServer

STAND_IN = r"""
import os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
time.sleep(0.5)  # like vLLM's imports: its engine processes start after the parent is bound
subprocess.Popen([sys.executable, "-c",
                  "import os, sys; open(sys.argv[1], 'w').write(repr(sorted(os.sched_getaffinity(0))))", sys.argv[2]])

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two cores to bind to one")
@pytest.mark.parametrize("bound", [True, False])
def test_every_process_the_server_starts_runs_on_its_cores(tmp_path: Path, bound: bool) -> None:
    cores = sorted(os.sched_getaffinity(0))
    server = VllmServer("m", tmp_path / "server.log", cpus={cores[-1]} if bound else None, start_timeout_s=60)
    out = tmp_path / "child_cores"
    server.args = [sys.executable, "-c", STAND_IN, str(server.port), str(out)]
    with server:
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.read_text() == repr([cores[-1]] if bound else cores)
