"""KVNamespace: everything that changes the bytes of a KV block, hashed into the name under
which persistent and shared tiers keep them.

A model's *path* is not enough: new weights in the same checkpoint directory (a fine-tune, a
new revision), an override of a config field that changes the KV (``rope_theta``, a sliding
window, a KV-cache dtype) or another prefix-hash algorithm all keep the path, and a restarted
engine would serve KV the previous model computed. The namespace digest covers a fingerprint
of the weights, the config fields, the KV geometry and dtype, the hash algorithm and seed, and
the record format; the components are kept beside a disk cache, so an engine that does not
reuse one can say which component changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import xxhash

#: Version of kvoffload's block record format (header layout, checksum and MAC rules): part of
#: every namespace, so records of an older format are never read as if they were current.
RECORD_FORMAT_VERSION = 2

#: Weight files are fingerprinted by their headers, sizes and this many evenly spread samples
#: (a fine-tune rewrites essentially every tensor, so any sample tells it apart; reading
#: 64 x 64 KiB per file keeps start-up cheap for checkpoints of any size).
_SAMPLES = 64
_SAMPLE_BYTES = 64 * 1024
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True, slots=True)
class KVNamespace:
    """Named components (weights, model, dtype, ...) whose digest names a tier's records."""

    components: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, components: Mapping[str, object]) -> KVNamespace:
        return cls(tuple(sorted((k, str(v)) for k, v in components.items())) + (("format", str(RECORD_FORMAT_VERSION)),))

    @property
    def digest(self) -> str:
        blob = json.dumps(self.components, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def as_dict(self) -> dict[str, str]:
        return dict(self.components)

    def describe(self) -> str:
        """One line: the digest and a short hash of each component."""
        parts = ", ".join(f"{k} {_short(v)}" for k, v in self.components)
        return f"namespace {self.digest} ({parts})"

    def differences(self, other: Mapping[str, str]) -> list[str]:
        """Components that differ from ``other`` (another namespace's ``as_dict``)."""
        mine = self.as_dict()
        return sorted(k for k in set(mine) | set(other) if mine.get(k) != other.get(k))


def _short(value: str) -> str:
    return value if len(value) <= 16 else xxhash.xxh3_64_hexdigest(value.encode())[:8]


def weights_fingerprint(path: str | os.PathLike[str]) -> str:
    """A fingerprint of a checkpoint directory's weight files (the config is its own component);
    "" if ``path`` is not a directory (the caller then names the weights by a revision id)."""
    root = Path(path)
    if not root.is_dir():
        return ""
    h = xxhash.xxh3_128()
    for f in sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)):
        h.update(f.name.encode() + b"\0")
        _fingerprint_file(h, f)
    return h.hexdigest()


def _fingerprint_file(h: xxhash.xxh3_128, path: Path) -> None:
    size = path.stat().st_size
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        for offset in _sample_offsets(size):
            f.seek(offset)
            h.update(f.read(_SAMPLE_BYTES))


def _sample_offsets(size: int) -> Iterable[int]:
    """The file's head (a safetensors header and its first tensors), its tail, and evenly
    spread samples between: the whole file when it is small."""
    if size <= _SAMPLES * _SAMPLE_BYTES:
        return range(0, size, _SAMPLE_BYTES)
    step = (size - _SAMPLE_BYTES) / (_SAMPLES - 1)
    return sorted({int(i * step) for i in range(_SAMPLES)})


def config_digest(config: Mapping[str, object], ignore: Iterable[str] = ()) -> str:
    """A stable digest of a model config dict, without keys that do not change the KV."""
    skip = set(ignore)
    kept = {k: v for k, v in config.items() if k not in skip}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]
