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
