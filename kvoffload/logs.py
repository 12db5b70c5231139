"""Log level for kvoffload's own loggers: ``KVOFFLOAD_LOG_LEVEL`` or the CLI's ``--log-level``.

The library adds no handler (an embedding application, e.g. vLLM, owns logging); the level
alone decides what reaches Python's last-resort stderr handler or the application's handlers.
The CLI adds one stderr handler so its lines carry a timestamp and the logger name.
"""

from __future__ import annotations

import logging
import os
import sys

LEVELS = ("debug", "info", "warning", "error")
ENV_VAR = "KVOFFLOAD_LOG_LEVEL"


def parse_level(value: str, source: str) -> int:
    if value.lower() not in LEVELS:
        raise ValueError(f"{source}={value!r}: use one of {', '.join(LEVELS)}")
    return int(getattr(logging, value.upper()))


def apply_env_level() -> None:
    """Honour KVOFFLOAD_LOG_LEVEL at import; a bad value is reported once, not fatal."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return
    logger = logging.getLogger("kvoffload")
    try:
        level = parse_level(value, ENV_VAR)
    except ValueError as exc:
        logger.warning("%s; keeping the default level", exc)
        return
    logger.setLevel(level)
    if level < logging.WARNING and not logger.handlers and not logging.getLogger().handlers:
        # Asked for info or debug lines where nobody configured logging (vLLM configures only
        # its own loggers): Python's last resort would print warnings only.
        _add_stderr_handler(logger)


def configure_cli(level: str | None) -> None:
    """The CLI's logging: ``level`` (or the environment, or warning) with one stderr handler."""
    logger = logging.getLogger("kvoffload")
    if level is not None:
        logger.setLevel(parse_level(level, "--log-level"))
    elif not os.environ.get(ENV_VAR):
        logger.setLevel(logging.WARNING)
    if not logger.handlers:
        _add_stderr_handler(logger)


def _add_stderr_handler(logger: logging.Logger) -> None:
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (tests and tools swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass
