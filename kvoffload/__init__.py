"""kvoffload: offload paged KV-cache blocks to host DRAM and local disk."""

from kvoffload.logs import apply_env_level

__version__ = "0.1.0"

apply_env_level()
