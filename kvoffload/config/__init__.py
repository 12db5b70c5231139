"""Offload configuration: one YAML file (or dict) → frozen, validated dataclasses.

``offload`` holds ``OffloadConfig``, ``tiers`` the tier list, ``sections`` transfer, metrics and
hints, ``values`` the sizes and paths every section parses, ``environment`` the checks against
this machine and the printed summary.
"""

from kvoffload.config.environment import check_environment, default_cache_dir, describe, weight_digest_dir
from kvoffload.config.offload import OffloadConfig
from kvoffload.config.sections import MAX_PRIORITY, HintsConfig, MetricsConfig, TransferConfig
from kvoffload.config.tiers import TierConfig
from kvoffload.config.values import LOAD_MODES, MAX_SIZE, expand_path, format_bytes, parse_size
from kvoffload.errors import ConfigError

__all__ = [
    "LOAD_MODES",
    "MAX_PRIORITY",
    "MAX_SIZE",
    "ConfigError",
    "HintsConfig",
    "MetricsConfig",
    "OffloadConfig",
    "TierConfig",
    "TransferConfig",
    "check_environment",
    "default_cache_dir",
    "describe",
    "expand_path",
    "format_bytes",
    "parse_size",
    "weight_digest_dir",
]
