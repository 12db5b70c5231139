"""Starts the single-process vLLM test jobs by forking them from a process that has already
imported vLLM: importing it takes 10-12 s of one core here, about as long as the job itself,
and CI runs some fifty such jobs. Each pytest worker keeps one server; a job still gets a
process of its own (its environment, its stdout and stderr, its exit status), so the tests
see what a fresh ``python script.py spec`` would give them.

Only jobs with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` come here: a job that starts vLLM's own
processes (tensor parallelism, an engine-core process) runs as a plain subprocess, as before.
``KVOFFLOAD_TEST_NO_FORKSERVER=1`` sends every job the plain way (to rule the server out)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_server: subprocess.Popen | None = None
#: Reply bytes read from the server past the last whole line (a fast job's pid and exit status
#: can arrive in one read).
_pending = b""


def run(script: Path, arg: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python script arg`` under ``env``: forked from the server where it can be."""
    if env.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0" or os.environ.get("KVOFFLOAD_TEST_NO_FORKSERVER"):
        return subprocess.run([sys.executable, str(script), arg], capture_output=True, text=True, timeout=timeout,
                              env=env)
    server = _started()
    assert server.stdin is not None
    with tempfile.TemporaryDirectory(prefix="kvoffload-job-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        server.stdin.write(json.dumps({"script": str(script), "arg": arg, "env": env, "stdout": str(out),
                                       "stderr": str(err)}).encode() + b"\n")
        server.stdin.flush()
        pid = int(_line(server, 120))
        try:
            code = int(_line(server, timeout))
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)  # the job is its own process group
            _line(server, 60)
            raise subprocess.TimeoutExpired([str(script), arg], timeout) from None
        return subprocess.CompletedProcess([str(script), arg], code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _line(server: subprocess.Popen, timeout: float) -> str:
    """The server's next reply line. Read from its pipe unbuffered: a buffered reader may hold
    the next line already, where select() on the pipe would wait for more in vain."""
    global _pending
    assert server.stdout is not None
    fd = server.stdout.fileno()
    deadline = time.monotonic() + timeout
    while b"\n" not in _pending:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, 4096)
        if not chunk:
            raise RuntimeError(f"the vLLM fork server died (rc={server.wait()})")
        _pending += chunk
    line, _, _pending = _pending.partition(b"\n")
    return line.decode()


def _started() -> subprocess.Popen:
    global _server, _pending
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        _pending = b""
    return _server


def _serve() -> None:
    """Imports vLLM once, then forks a job per request line: the reply is the job's pid, then its
    exit status."""
    import atexit
    import runpy
    import threading
    import traceback

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the imports print goes to stderr, not into the replies
    import torch  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401

    if threading.active_count() != 1:  # a thread's locks would be held forever in the children
        raise SystemExit(f"the vLLM fork server has {threading.active_count()} threads after importing vLLM")
    for request in sys.stdin:
        job = json.loads(request)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)
                replies.close()
                for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY | os.O_CREAT),
                                        (2, job["stderr"], os.O_WRONLY | os.O_CREAT)):
                    opened = os.open(path, flags, 0o600)
                    os.dup2(opened, fd)
                    os.close(opened)
                os.environ.clear()
                os.environ.update(job["env"])
                sys.argv = [job["script"], job["arg"]]
                sys.path.insert(0, str(Path(job["script"]).parent))
                runpy.run_path(job["script"], run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 -- any failure of the job is its exit status
                traceback.print_exc()
            finally:
                try:
                    atexit._run_exitfuncs()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
        replies.write(f"{pid}\n")
        _, status = os.waitpid(pid, 0)
        replies.write(f"{os.waitstatus_to_exitcode(status)}\n")


if __name__ == "__main__":
    _serve()
