"""The ``medium: fs`` tier's own config keys, validated like every other key: each bad value is
a one-line ConfigError naming ``tiers[i].<key>``, the value and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvoffload.errors import ConfigError


@dataclass(frozen=True, slots=True)
class FsOptions:
    #: Directories the blocks are spread over by key (``paths:``); empty: the tier's ``path``.
    paths: tuple[str, ...] = ()
    #: Backpressure: a store is allowed 10 ms plus this many ms per MiB (queueing included);
    #: while stores run later than that, new ones are skipped.
    max_store_ms_per_mib: float = 20.0
    #: An I/O outage takes the tier out this long, then it is tried again.
    retry_after_s: float = 10.0
    #: Threads each process reads and writes a batch's files with.
    io_threads: int = 4


OPTION_KEYS = frozenset({"paths", "max_store_ms_per_mib", "retry_after_s", "io_threads"})


def _number(raw: Mapping[str, Any], name: str, default: float, low: float, high: float, key: str, eg: str) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise ConfigError(f"{key}.{name}: {value!r}; give a number above {low:g} and at most {high:g}, e.g. {eg}")
    return float(value)


def parse_options(raw: Mapping[str, Any], key: str) -> FsOptions:
    paths = raw.get("paths", [])
    if isinstance(paths, str) or not isinstance(paths, list) or not all(
            isinstance(p, str) and p and "\0" not in p and len(p) <= 4000 for p in paths):
        raise ConfigError(f"{key}.paths: {str(paths)[:80]!r}; give a list of directories, e.g. "
                          "[/mnt/nvme0/kv, /mnt/nvme1/kv]")
    if len(set(paths)) != len(paths):
        raise ConfigError(f"{key}.paths: {paths[:4]!r} names a directory twice; list each directory once")
    threads = raw.get("io_threads", 4)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
        raise ConfigError(f"{key}.io_threads: {threads!r}; give a whole number from 1 to 64, e.g. 4")
    return FsOptions(paths=tuple(paths), io_threads=threads,
                     max_store_ms_per_mib=_number(raw, "max_store_ms_per_mib", 20.0, 0.0, 60_000.0, key, "20"),
                     retry_after_s=_number(raw, "retry_after_s", 10.0, 0.0, 86_400.0, key, "10"))
