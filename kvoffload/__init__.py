"""kvoffload: offload paged KV-cache blocks to host DRAM and local disk."""

__version__ = "0.1.0"
