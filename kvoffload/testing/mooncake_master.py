"""A mooncake_master (with its HTTP metadata server) on free loopback ports, for tests, the
benchmark and demos: started, killed and restarted on the same ports, so clients reconnect.

``segment_holder()`` starts Mooncake's standalone client, which lends DRAM to the store and
outlives the engine processes of a test (a replica's own segment leaves with it).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range.

    A port from ``bind(0)`` is free only until the probe closes it: any process's next outgoing
    connection or ``bind(0)`` may take it before the child binds it (a vLLM beside the test did,
    and the master died on its admin port). The kernel never hands out ports below its
    ephemeral range on its own, so one of those stays ours unless someone names it.
    """
    low = max(_ephemeral_low(), 10001)
    for _ in range(200):
        port = random.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the low range is full: take what the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mooncake_binary(name: str) -> str | None:
    """A Mooncake executable next to this interpreter (a venv's bin) or on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


class _MasterDied(RuntimeError):
    """The master process exited while it started (a port taken under it, most often)."""


class MooncakeMaster:
    def __init__(self, log_dir: str | None = None) -> None:
        binary = mooncake_binary("mooncake_master")
        if binary is None:
            raise FileNotFoundError("mooncake_master not found; pip install 'kvoffload[mooncake]'")
        self.binary = binary
        self.rpc_port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()  # its admin/metrics server (default 9003 would clash)
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kvoffload-mooncake-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.holders: list[subprocess.Popen[bytes]] = []
        self.starts = 0

    @property
    def master(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def tier(self, **extra: object) -> dict[str, object]:
        """A ``medium: mooncake`` tier entry for this master."""
        return {"name": "shared", "medium": "mooncake", "master": self.master, "metadata_server": self.metadata_server,
                "protocol": "tcp", "local_hostname": "127.0.0.1", **extra}

    def start(self, timeout_s: float = 20.0, attempts: int = 3) -> MooncakeMaster:
        """Start it and wait until its RPC, metadata and admin servers all answer.

        The admin server binds last and a master whose admin port is taken exits after the
        other two answer, so all three are waited for. A first start that dies is retried on
        fresh ports; a restart keeps its ports (clients reconnect to them).
        """
        for attempt in range(attempts):
            try:
                return self._start_once(timeout_s)
            except _MasterDied:
                if self.starts > 1 or attempt == attempts - 1:
                    raise
                self.starts = 0
                self.rpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> MooncakeMaster:
        self.starts += 1
        log = open(self.log_dir / f"master.{self.starts}.log", "wb")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            [self.binary, "--rpc_port", str(self.rpc_port), "--enable_http_metadata_server=true",
             "--http_metadata_server_host", "127.0.0.1", "--http_metadata_server_port", str(self.http_port),
             "--metrics_host", "127.0.0.1", "--metrics_port", str(self.metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is None and self._answers():
                time.sleep(0.3)  # one that lost a port to another process exits right after binding
            if self.proc.poll() is not None or "Failed to start" in self._log():
                self.kill()
                raise _MasterDied(f"mooncake_master exited: {self.log_tail()}")
            if self._answers():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"mooncake_master did not answer within {timeout_s} s: {self.log_tail()}")

    def _log(self) -> str:
        try:
            return (self.log_dir / f"master.{self.starts}.log").read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"

    def log_tail(self) -> str:
        """The current master's last log lines naming an error, else its last lines."""
        lines = [line for line in self._log().splitlines() if "snapshot_backup_dir" not in line]
        errors = [line for line in lines if line.startswith(("E", "F"))]
        return " | ".join((errors or lines)[-3:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.rpc_port), timeout=0.2).close()
            socket.create_connection(("127.0.0.1", self.metrics_port), timeout=0.2).close()
            urllib.request.urlopen(f"{self.metadata_server}?key=probe", timeout=0.5).close()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def segment_holder(self, size: str = "256MB") -> None:
        """Lend ``size`` of DRAM to the store from a process of its own (Mooncake's standalone client)."""
        binary = mooncake_binary("mooncake_client")
        if binary is None:
            raise FileNotFoundError("mooncake_client not found; pip install 'kvoffload[mooncake]'")
        log = open(self.log_dir / f"holder.{len(self.holders)}.log", "wb")  # noqa: SIM115 - the child holds it
        self.holders.append(subprocess.Popen(
            [binary, f"--global_segment_size={size}", f"--master_server_address={self.master}",
             f"--metadata_server={self.metadata_server}", "--host=127.0.0.1", f"--port={free_port()}",
             "--protocol=tcp"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
        time.sleep(2.0)  # it mounts its segment with the master

    def kill(self) -> None:
        """kill -9 the master (its objects are lost; clients see RPC failures)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> MooncakeMaster:
        self.kill()
        return self.start()

    def stop(self) -> None:
        for holder in self.holders:
            if holder.poll() is None:
                os.killpg(holder.pid, signal.SIGKILL)
                holder.wait()
        self.holders.clear()
        self.kill()

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
