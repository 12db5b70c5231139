"""A vLLM request's LoRA adapter in its offload keys.

vLLM's block hashes name an adapter by its name alone, so an adapter retrained under the same
name and served after a restart would find the old adapter's blocks in a disk, fs or shared
tier. The keys of a request running with an adapter are salted with a digest of every byte of
the adapter's files (cached by file identity, like the model's weights); vLLM loads an adapter
once per (name, id, path), so the digest is computed once per adapter per process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import xxhash

from kvoffload.weight_digests import adapter_fingerprint

logger = logging.getLogger("vllm.kvoffload")


class AdapterSalt:
    """``RequestSalt`` for vLLM requests: None without an adapter, else its digest."""

    def __init__(self, cache_dir: Path | None) -> None:
        self._cache_dir = cache_dir
        self._memo: dict[tuple[str, int, str], bytes] = {}

    def __call__(self, request: Any) -> bytes | None:
        lora = request.lora_request
        if lora is None:
            return None
        ident = (str(lora.lora_name), int(lora.lora_int_id), str(lora.lora_path))
        salt = self._memo.get(ident)
        if salt is None:
            salt = self._memo[ident] = self._digest(*ident)
        return salt

    def _digest(self, name: str, int_id: int, path: str) -> bytes:
        fingerprint = adapter_fingerprint(path, self._cache_dir)
        if not fingerprint:
            logger.warning("kvoffload: LoRA adapter %r at %r is not a local directory: its offload keys name it by "
                           "name and path only; a retrained adapter must get a new name or path", name, path)
            fingerprint = f"id:{name}@{path}"
        else:
            logger.info("kvoffload: LoRA adapter %r (%s): offload keys salted with %s", name, path, fingerprint)
        return xxhash.xxh3_128(f"lora|{fingerprint}".encode()).digest()
