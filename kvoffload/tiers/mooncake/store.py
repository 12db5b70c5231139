"""MooncakeStore: the KeyValueStore of a Mooncake Store client (``mooncake.store``).

Connecting checks what Mooncake's own set-up would otherwise hang on (its client waits about
90 s for a master that is not there): the master's RPC port and the HTTP metadata server are
probed first, and set-up itself runs under a deadline, so a wrong address is a one-line
StoreUnavailableError naming the key, not a stalled start.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

from kvoffload.errors import ConfigError, StoreUnavailableError
from kvoffload.tiers.mooncake.options import MooncakeOptions
from kvoffload.tiers.store.kv_store import KeyValueStore

logger = logging.getLogger(__name__)

#: Mooncake's status codes (mooncake-store ErrorCode) that mean the store is unreachable.
_UNREACHABLE = {-1, -800, -900}
_OBJECT_ALREADY_EXISTS = -705
_CLOSED = -1  # what calls on a closed client answer (INTERNAL_ERROR: counted as unreachable)
INSTALL_HINT = ("pip install 'kvoffload[mooncake]' (CUDA hosts: pip install mooncake-transfer-engine) "
                "and apt-get install -y libibverbs1 librdmacm1")


def load_client_class() -> Any:
    """MooncakeDistributedStore, or a ConfigError saying what to install."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise ConfigError(f"medium mooncake: the Mooncake client is not importable ({' '.join(str(exc).split())[:120]}); "
                          f"{INSTALL_HINT}") from None
    return MooncakeDistributedStore


def _probe_master(opts: MooncakeOptions, key: str, timeout_s: float) -> None:
    host, port = opts.master_host_port
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise StoreUnavailableError(
            f"{key}.master: no mooncake_master answers at {opts.master} ({reason}); start one with "
            f"`mooncake_master --rpc_port {port} --enable_http_metadata_server=true` or fix the address") from None


def _probe_metadata(opts: MooncakeOptions, key: str, timeout_s: float) -> None:
    if not opts.metadata_server.startswith(("http://", "https://")):
        return  # etcd, redis, P2PHANDSHAKE: Mooncake's set-up reports those itself
    try:
        urllib.request.urlopen(f"{opts.metadata_server}?key=kvoffload-probe", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered (404 for an unknown key): a metadata server is there
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise StoreUnavailableError(
            f"{key}.metadata_server: nothing answers at {opts.metadata_server} ({reason}); start the master with "
            "--enable_http_metadata_server=true --http_metadata_server_port PORT, or fix the URL") from None


class MooncakeStore(KeyValueStore):
    def __init__(self, client: Any, opts: MooncakeOptions) -> None:
        self.client = client
        self.name = f"mooncake store at {opts.master}"
        self.protocol = opts.protocol
        self._closed = False

    @classmethod
    def connect(cls, opts: MooncakeOptions, key: str, lend_segment: bool, timeout_s: float = 30.0) -> MooncakeStore:
        """A set-up client; ``lend_segment``: contribute ``opts.segment`` bytes of this process's DRAM."""
        client_class = load_client_class()
        _probe_master(opts, key, min(timeout_s, 3.0))
        _probe_metadata(opts, key, min(timeout_s, 3.0))
        client = client_class()
        segment = opts.segment if lend_segment else 0
        result: list[Any] = []

        def setup() -> None:
            try:
                result.append(client.setup(opts.hostname(), opts.metadata_server, segment, 0, opts.protocol,
                                           opts.device_name, opts.master))
            except Exception as exc:  # noqa: BLE001 - reported below as the set-up's failure
                result.append(exc)

        worker = threading.Thread(target=setup, name="kvoffload-mooncake-setup", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if not result:
            raise StoreUnavailableError(f"{key}.master: Mooncake set-up against {opts.master} did not finish in "
                                        f"{timeout_s:.0f} s; check that it is a mooncake_master and reachable")
        if result[0] != 0:
            what = result[0] if isinstance(result[0], Exception) else f"status {result[0]}"
            raise StoreUnavailableError(f"{key}: Mooncake set-up failed ({what}) with master {opts.master}, metadata "
                                        f"{opts.metadata_server}, protocol {opts.protocol}; check those keys "
                                        "(rdma needs device_name) and the master's log")
        return cls(client, opts)

    # A closed client must not be called (it crashes the process): calls after close fail.
    def exists(self, keys: list[str]) -> list[int]:
        return [_CLOSED] * len(keys) if self._closed else list(self.client.batch_is_exist(keys))

    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        if self._closed:
            return [_CLOSED] * len(keys)
        return [0 if s == _OBJECT_ALREADY_EXISTS else s for s in self.client.batch_put_from(keys, ptrs, sizes)]

    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        return [_CLOSED] * len(keys) if self._closed else list(self.client.batch_get_into(keys, ptrs, sizes))

    def put_from_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        if self._closed:
            return [_CLOSED] * len(keys)
        status = self.client.batch_put_from_multi_buffers(keys, ptrs, sizes)
        return [0 if s == _OBJECT_ALREADY_EXISTS else s for s in status]

    def get_into_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        if self._closed:
            return [_CLOSED] * len(keys)
        return list(self.client.batch_get_into_multi_buffers(keys, ptrs, sizes))

    @property
    def needs_registration(self) -> bool:
        return self.protocol != "tcp"  # the TCP transport copies from any host address

    def remove(self, keys: list[str]) -> None:
        self.client.batch_remove(keys, True)  # force: a lease held by a reader does not keep bad bytes

    def unreachable(self, status: int) -> bool:
        return status in _UNREACHABLE or -1099 <= status <= -1000  # ..., etcd / HA errors

    def register(self, ptr: int, size: int) -> None:
        if self._closed:
            return
        status = self.client.register_buffer(ptr, size)
        if status != 0:
            raise StoreUnavailableError(f"local_buffer: Mooncake could not register {size} bytes of staging memory "
                                        f"(status {status}); lower local_buffer or raise the locked-memory limit")

    def unregister(self, ptr: int) -> None:
        if not self._closed:
            self.client.unregister_buffer(ptr)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.close()
