"""The config's values: sizes, shares, paths, integers and mappings, each parsed or rejected
with a one-line error that names the key and the fix."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from kvoffload.errors import ConfigError, describe_value

_UNITS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}


#: Larger sizes are typos; they would only fail later, deep inside an allocation.
MAX_SIZE = 1 << 60


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any, key: str) -> int:
    """``8GiB``, ``1.5GB``, ``512MiB`` or an int → bytes (> 0)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: {describe_value(value)} is not a size; use bytes or a string like '8GiB'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        if _SIZE_RE.match(value.strip().lstrip("-+")) and value.strip().startswith("-"):
            raise ConfigError(f"{key}: size must be positive, got {describe_value(value)}")
        m = _SIZE_RE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ConfigError(
                f"{key}: cannot parse size {describe_value(value)}; use a number with KiB, MiB, GiB, TiB, KB, MB, GB or TB"
            )
        scaled = float(m.group(1)) * _UNITS[unit]  # inf for hundreds of digits
        if not scaled <= MAX_SIZE:
            raise ConfigError(f"{key}: {describe_value(value)} is too large; at most {MAX_SIZE} bytes (1 EiB)")
        size = int(scaled)
    else:
        raise ConfigError(f"{key}: {describe_value(value)} is not a size; use bytes or a string like '8GiB'")
    if size <= 0:
        raise ConfigError(f"{key}: size must be positive, got {describe_value(value)}")
    if size > MAX_SIZE:
        raise ConfigError(f"{key}: {describe_value(value)} is too large; at most {MAX_SIZE} bytes (1 EiB)")
    return size


def check_keys(raw: Mapping[str, Any], allowed: set[str], path: str) -> None:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(k if isinstance(k, str) and k.isprintable() else repr(k) for k in set(raw) - allowed)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{where}: unknown key; allowed keys here: {', '.join(sorted(allowed))}")


def section(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A nested mapping (absent or null: empty); anything else is an error naming it."""
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: {describe_value(value)} must be a mapping of its keys (or left out)")
    return value


def int_key(raw: Mapping[str, Any], key: str, default: int | None, path: str, minimum: int) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{path}{key}: {describe_value(value)} must be an integer >= {minimum}")
    return value


_SHARE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def capacity_share_of(value: Any, key: str, allowed: bool) -> float | None:
    """``capacity: 50%`` as 0.5 (None: a size, parsed as such); only where the kind sizes
    itself from the free space (``TierKind.relative_capacity``)."""
    if not isinstance(value, str) or not value.strip().endswith("%"):
        return None
    if not allowed:
        raise ConfigError(f"{key}: {describe_value(value)} is a share of the free disk space, which only a disk tier takes; "
                          "give a size, e.g. 8GiB")
    number = value.strip()[:-1].strip()
    # ASCII digits only: float() also takes "1_0", full-width and Arabic-Indic digits.
    share = float(number) if _SHARE_RE.match(number) else float("nan")
    if not 0 < share <= 100:
        raise ConfigError(f"{key}: {describe_value(value)}; give a share of the free space in (0%, 100%], e.g. 50%, or a "
                          "size, e.g. 200GiB")
    return share / 100


_UNSET_VAR_RE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(path: str, key: str) -> str:
    """``~`` and ``$VARS`` expanded; a variable left unset is an error naming it (expanding it to
    nothing, or keeping ``$VAR`` as a directory name, would quietly open another directory:
    replicas that should share one would each get their own)."""
    expanded = os.path.expanduser(os.path.expandvars(path))
    unset = _UNSET_VAR_RE.search(expanded)
    if unset:
        name = unset.group(1).strip("{}")
        raise ConfigError(f"{key}: {path[:200]!r} uses ${name}, which is not set; set {name} in the engine's "
                          "environment or write the directory out")
    return expanded


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


#: How a hit is served. auto: the cost model picks, per request, loading or recomputing (all of
#: the hit or its leading part), and loads layer by layer inside the step where that fits;
#: layerwise: always load, layer by layer where the engine can; async: always load, the request
#: waits a step for the whole load (the behaviour before the cost model); never-recompute:
#: always load, layer by layer or not as auto would.
LOAD_MODES = ("auto", "layerwise", "async", "never-recompute")


def load_mode_of(raw: Mapping[str, Any], key: str, default: str | None) -> str | None:
    value = raw.get("load_mode", default)
    if value is not None and value not in LOAD_MODES:
        raise ConfigError(f"{key}: {describe_value(value)} is not a load mode; use one of {', '.join(LOAD_MODES)}")
    return value
