"""kvoffload's native code, one subpackage per concern:

- ``copies``: batched block copies, ``copy_blocks(src, dst, src_ids, dst_ids)`` and
  ``copy_block_groups`` (re-exported here; CPU loop and CUDA kernel);
- ``ledger``: the block ledger in C (``_ledger``, built by ``pip install``; optional);
- ``fs_records``: the fs tier's record files in C (compiled on first use).

``build`` compiles the first-use libraries. Nothing here decides policy or knows a tier's
layout beyond the bytes it is handed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvoffload_ext.copies import copy_block_groups, copy_blocks

__all__ = ["copy_block_groups", "copy_blocks"]


def __getattr__(name: str) -> Any:
    """``copy_blocks`` and ``copy_block_groups`` import torch on first use, not here: the
    scheduler half imports ``kvoffload_ext.ledger`` through this package and stays tensor-free
    (a missing torch used to surface as "native ledger not built")."""
    if name in __all__:
        from kvoffload_ext import copies

        return getattr(copies, name)
    raise AttributeError(f"module 'kvoffload_ext' has no attribute {name!r}")
