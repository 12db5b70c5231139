"""The ``medium: mooncake`` tier's own config keys, validated like every other key: each bad
value is a one-line ConfigError naming ``tiers[i].<key>``, the value and the fix."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvoffload.config import parse_size
from kvoffload.errors import ConfigError

_ADDR = re.compile(r"^\[?([A-Za-z0-9_.:-]+?)\]?:(\d{1,5})$")
_METADATA = ("http://", "https://", "etcd://", "redis://")


@dataclass(frozen=True, slots=True)
class MooncakeOptions:
    master: str  # host:port of mooncake_master's RPC service
    metadata_server: str  # http://host:port/metadata, etcd://..., redis://... or P2PHANDSHAKE
    protocol: str = "tcp"
    device_name: str = ""  # RDMA NICs (comma-separated), for protocol rdma
    segment: int = 1 << 30  # DRAM this process lends the store (0: lend none, use others')
    local_buffer: int = 256 << 20  # registered staging memory for this process's copies
    local_hostname: str = ""  # how other clients reach this one; default: the address facing the master
    retry_after_s: float = 10.0  # an outage takes the tier out this long, then it is tried again

    @property
    def master_host_port(self) -> tuple[str, int]:
        m = _ADDR.match(self.master)
        assert m is not None
        return m.group(1), int(m.group(2))

    def hostname(self) -> str:
        """``local_hostname``, or the local address of the interface that reaches the master."""
        if self.local_hostname:
            return self.local_hostname
        host, port = self.master_host_port
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, port))  # UDP: picks a route, sends nothing
                return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


OPTION_KEYS = frozenset({"master", "metadata_server", "protocol", "device_name", "segment", "local_buffer",
                         "local_hostname", "retry_after_s"})


def parse_options(raw: Mapping[str, Any], key: str) -> MooncakeOptions:
    master = raw.get("master")
    if master is None:
        raise ConfigError(f"{key}.master: required; the mooncake_master RPC address, e.g. 127.0.0.1:50051")
    m = _ADDR.match(master) if isinstance(master, str) else None
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ConfigError(f"{key}.master: {str(master)[:80]!r} is not host:port; e.g. 127.0.0.1:50051")
    meta = raw.get("metadata_server")
    if meta is None:
        raise ConfigError(f"{key}.metadata_server: required; the master's HTTP metadata server, "
                          "e.g. http://127.0.0.1:8080/metadata (or etcd://host:2379, P2PHANDSHAKE)")
    if not isinstance(meta, str) or not (meta.startswith(_METADATA) or meta == "P2PHANDSHAKE") or len(meta) > 1000:
        raise ConfigError(f"{key}.metadata_server: {str(meta)[:80]!r}; use http://host:port/metadata, "
                          "etcd://host:port, redis://host:port or P2PHANDSHAKE")
    protocol = raw.get("protocol", "tcp")
    if protocol not in ("tcp", "rdma"):
        raise ConfigError(f"{key}.protocol: {str(protocol)[:40]!r}; use tcp or rdma")
    device = raw.get("device_name", "")
    if not isinstance(device, str) or not device.isprintable():
        raise ConfigError(f"{key}.device_name: {str(device)[:40]!r}; give the RDMA NIC names, e.g. mlx5_0,mlx5_1")
    hostname = raw.get("local_hostname", "")
    if not isinstance(hostname, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]*", hostname):
        raise ConfigError(f"{key}.local_hostname: {str(hostname)[:40]!r}; give this machine's address, e.g. 10.0.0.5")
    retry = raw.get("retry_after_s", 10.0)
    if isinstance(retry, bool) or not isinstance(retry, (int, float)) or not 0 < retry <= 86400:
        raise ConfigError(f"{key}.retry_after_s: {retry!r}; give seconds between 0 and 86400, e.g. 10")
    segment = raw.get("segment", 1 << 30)
    lends_none = segment in (0, "0") and not isinstance(segment, bool)
    segment = 0 if lends_none else parse_size(segment, f"{key}.segment")
    return MooncakeOptions(master=master, metadata_server=meta, protocol=protocol, device_name=device,
                           segment=segment, local_buffer=parse_size(raw.get("local_buffer", 256 << 20),
                                                                    f"{key}.local_buffer"),
                           local_hostname=hostname, retry_after_s=float(retry))
