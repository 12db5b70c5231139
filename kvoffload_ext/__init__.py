"""kvoffload's native code, one subpackage per concern:

- ``copies``: batched block copies, ``copy_blocks(src, dst, src_ids, dst_ids)`` and
  ``copy_block_groups`` (re-exported here; CPU loop and CUDA kernel);
- ``ledger``: the block ledger in C (``_ledger``, built by ``pip install``; optional);
- ``fs_records``: the fs tier's record files in C (compiled on first use).

``build`` compiles the first-use libraries. Nothing here decides policy or knows a tier's
layout beyond the bytes it is handed.
"""

from kvoffload_ext.copies import copy_block_groups, copy_blocks

__all__ = ["copy_block_groups", "copy_blocks"]
