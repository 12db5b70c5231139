"""Errors every layer may raise: a leaf module, so raising one imports nothing above it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and the fix."""


class UnknownPluginError(ConfigError):
    """A registry name (policy, spec, connector, tier kind) that resolves to nothing usable;
    the message lists the known names."""


class StoreUnavailableError(ConfigError):
    """A shared store's service does not answer at start-up; the message names the config key,
    the address and how to start or reach it."""


def require_positive(name: str, value: int) -> int:
    """``value`` if it is at least 1, else a ValueError naming it: sizes and counts that 0 or
    a negative number would turn into an empty cache or a division by zero."""
    if value < 1:
        raise ValueError(f"{name}={value}: must be >= 1")
    return value


def describe_value(value: object, limit: int = 60) -> str:
    """``value`` as an error message shows it: whole where it is short, else by type and size.

    A hostile config or log can hand over a value whose text is gigabytes (a YAML alias bomb,
    a 10,000-digit integer, a list of a million items): ``repr`` of it, or ``str(value)[:40]``,
    builds the whole text before cutting it. This renders at most about ``limit`` characters."""
    shown = _short(value, limit, 3)
    if shown is not None:
        return shown
    if isinstance(value, str):
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, int):
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    if isinstance(value, bytes):
        return f"{len(value):,} bytes"
    if isinstance(value, dict):
        return f"a mapping of {len(value):,} keys"
    if isinstance(value, list | tuple | set | frozenset):
        return f"a {type(value).__name__} of {len(value):,} items"
    return f"a {type(value).__name__}"


def _short(value: object, budget: int, depth: int) -> str | None:
    """``repr(value)`` if it fits in ``budget`` characters, found without building a longer one; else None."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        text = repr(value)
    elif isinstance(value, int):
        text = repr(value) if value.bit_length() <= 64 else ""
    elif isinstance(value, str):
        text = repr(value) if len(value) <= budget else ""
    elif isinstance(value, list | tuple | dict) and depth > 0 and len(value) <= budget // 2:
        items = value.items() if isinstance(value, dict) else [(None, v) for v in value]
        parts = []
        used = 2
        for k, v in items:
            for x in ((k, v) if isinstance(value, dict) else (v,)):
                part = _short(x, budget - used, depth - 1)
                if part is None:
                    return None
                parts.append(part)
                used += len(part) + 2
        if isinstance(value, dict):
            inner = ", ".join(f"{parts[i]}: {parts[i + 1]}" for i in range(0, len(parts), 2))
            text = "{" + inner + "}"
        else:
            inner = ", ".join(parts)
            text = f"({inner}{',' if len(parts) == 1 else ''})" if isinstance(value, tuple) else f"[{inner}]"
    else:
        return None
    return text if text and len(text) <= budget else None
