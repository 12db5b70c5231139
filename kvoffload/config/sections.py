"""The config's small sections: ``transfer``, ``metrics`` and ``hints``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvoffload.config.values import check_keys
from kvoffload.errors import ConfigError, describe_value


@dataclass(frozen=True, slots=True)
class TransferConfig:
    backend: str = "auto"
    num_streams: int = 4


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    events: bool = False
    prometheus_port: int | None = None


#: The priorities a request hint may name (``kvoffload.offload.hints``); an operator lowers the
#: ceiling with ``hints.max_priority``.
MAX_PRIORITY = 1000


@dataclass(frozen=True, slots=True)
class HintsConfig:
    """What a request's finish says of its return (``kvoffload.offload.hints``): a request whose
    output holds one of ``tool_call_token_ids`` (the model's tool-call token, e.g. Qwen's
    ``<tool_call>``) ended in a tool call, and its caller is expected back within
    ``tool_return_s`` unless its hint said when. ``clock_speed``: hint seconds per wall-clock
    second, for a trace replayed faster than it happened (20: a replay at 20x), so hints and
    the policy's horizons keep the trace's meaning. ``max_priority``: the highest priority a
    client's hint may raise its blocks to (0: none above normal; higher ones count as this).
    ``tenant_keys``: entries of ``kv_transfer_params`` that a trusted gateway sets to name the
    tenant; with the request's ``cache_salt`` and LoRA adapter they scope hint sessions, so one
    tenant's hints never reach another's blocks."""

    tool_call_token_ids: tuple[int, ...] = ()
    tool_return_s: float = 10.0
    clock_speed: float = 1.0
    max_priority: int = 0
    tenant_keys: tuple[str, ...] = ()


def parse_hints(raw: Mapping[str, Any]) -> HintsConfig:
    check_keys(raw, {"tool_call_token_ids", "tool_return_s", "clock_speed", "max_priority", "tenant_keys"}, "hints")
    speed = raw.get("clock_speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.001 <= speed <= 1e6:
        raise ConfigError(f"hints.clock_speed: {describe_value(speed)} must be a number in [0.001, 1e6]; 1 = real time")
    ids = raw.get("tool_call_token_ids", [])
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ConfigError(f"hints.tool_call_token_ids: {describe_value(ids)} must be a list of token ids (integers >= 0)")
    ret = raw.get("tool_return_s", 10.0)
    if isinstance(ret, bool) or not isinstance(ret, (int, float)) or not 0 < ret <= 86400:
        raise ConfigError(f"hints.tool_return_s: {describe_value(ret)} must be seconds in (0, 86400], e.g. 10")
    top = raw.get("max_priority", 0)
    if isinstance(top, bool) or not isinstance(top, int) or not -MAX_PRIORITY <= top <= MAX_PRIORITY:
        raise ConfigError(f"hints.max_priority: {describe_value(top)} must be an integer in [-{MAX_PRIORITY}, "
                          f"{MAX_PRIORITY}]; 0 lets no client raise its priority")
    keys = raw.get("tenant_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k and k != "kvoffload" for k in keys):
        raise ConfigError(f"hints.tenant_keys: {describe_value(keys)} must be a list of kv_transfer_params entry names "
                          "(not 'kvoffload'), e.g. [tenant]")
    return HintsConfig(tuple(ids), float(ret), float(speed), top, tuple(keys))
