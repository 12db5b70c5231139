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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import xxhash

#: Version of kvoffload's block record format (header layout, checksum and MAC rules): part of
#: every namespace, so records of an older format are never read as if they were current.
RECORD_FORMAT_VERSION = 2




@dataclass(frozen=True, slots=True)
class KVNamespace:
    """Named components (weights, model, dtype, ...) whose digest names a tier's records."""

    components: tuple[tuple[str, str], ...]
    #: What a person calls the model (a checkpoint's path, a hub id, a built-in name): shown by
    #: ``kvoffload cache ls``, never part of the digest (a moved checkpoint is the same KV).
    label: str = ""

    @classmethod
    def of(cls, components: Mapping[str, object], label: str = "") -> KVNamespace:
        return cls(tuple(sorted((k, str(v)) for k, v in components.items())) + (("format", str(RECORD_FORMAT_VERSION)),),
                   label)

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


def config_digest(config: Mapping[str, object], ignore: Iterable[str] = ()) -> str:
    """A stable digest of a model config dict, without keys that do not change the KV."""
    skip = set(ignore)
    kept = {k: v for k, v in config.items() if k not in skip}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]
