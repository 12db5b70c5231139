"""The one start-up poll (kvoffload.testing.health): a server that comes up, one whose process
exits first, and one that never answers."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading

import pytest

from kvoffload.testing.health import StartError, answers, wait_healthy


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_server_that_answers_is_waited_for():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        wait_healthy(base, None, "the test server", 5)
        assert answers(f"{base}/health") and not answers(f"{base}/nothing")
    finally:
        server.shutdown()


def test_a_process_that_exits_is_named_with_its_log_and_one_that_never_answers_times_out():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(StartError, match=r"^the server exited \(3\) at start-up: boom$"):
        wait_healthy(f"http://127.0.0.1:{port}", proc, "the server", 30, lambda: "boom", poll_s=0.05)
    with pytest.raises(StartError, match=rf"did not answer http://127.0.0.1:{port}/health within 0 s"):
        wait_healthy(f"http://127.0.0.1:{port}", None, "the server", 0.2, poll_s=0.05)
