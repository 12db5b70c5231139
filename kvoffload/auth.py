"""Authenticated block records: a secret the replicas share, and the tag each record carries.

Without a secret a record's tag is a checksum of its payload (xxh3-128): it catches torn,
flipped and misplaced records, not forged ones, since anyone who can write the store or the
file can compute it. With a secret (``auth.secret_file`` or ``auth.secret_env``, never in
the YAML) the tag is a keyed MAC over the tier's namespace, the block's key and its payload,
so a record written by anyone without the secret fails on read: a miss, dropped and counted.
The secret's *id* (a one-way digest, not the secret) enters the tier's namespace: replicas
with different secrets (a rotation under way) use disjoint keys instead of rejecting each
other's records.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kvoffload.errors import ConfigError

TAG_BYTES = 16
ALGORITHMS = ("hmac-sha256", "blake3")
_MIN_SECRET_BYTES = 16


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Where the shared secret comes from (at most one of the two) and the MAC algorithm."""

    secret_file: str | None = None
    secret_env: str | None = None
    algorithm: str = "hmac-sha256"

    def load_secret(self) -> bytes | None:
        """The secret's bytes, or None when none is configured; a one-line ConfigError naming
        the file or variable when it cannot be read or is too short to be a secret."""
        if self.secret_file is not None:
            try:
                secret = Path(self.secret_file).read_bytes().strip()
            except OSError as exc:
                raise ConfigError(f"auth.secret_file: cannot read {self.secret_file!r} ({exc.strerror}); "
                                  "give a readable file holding the replicas' shared secret") from None
            source = f"auth.secret_file: {self.secret_file!r}"
        elif self.secret_env is not None:
            value = os.environ.get(self.secret_env)
            if value is None:
                raise ConfigError(f"auth.secret_env: environment variable {self.secret_env} is not set; "
                                  "export it with the replicas' shared secret")
            secret, source = value.strip().encode(), f"auth.secret_env: {self.secret_env}"
        else:
            return None
        if len(secret) < _MIN_SECRET_BYTES:
            raise ConfigError(f"{source} holds {len(secret)} bytes; a secret needs at least {_MIN_SECRET_BYTES} "
                              "(e.g. the output of: openssl rand -hex 32)")
        return secret


def parse_auth(raw: object) -> AuthConfig:
    if raw is None:
        return AuthConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"auth: {raw!r} must be a mapping with secret_file or secret_env")
    allowed = {"secret_file", "secret_env", "algorithm"}
    unknown = sorted(str(k) for k in set(raw) - allowed)
    if unknown:
        hint = " (the secret itself never goes in the config)" if "secret" in unknown else ""
        raise ConfigError(f"auth.{unknown[0]}: unknown key{hint}; allowed keys here: {', '.join(sorted(allowed))}")
    file, env = raw.get("secret_file"), raw.get("secret_env")
    if file is not None and env is not None:
        raise ConfigError("auth: give secret_file or secret_env, not both")
    for key, value in (("secret_file", file), ("secret_env", env)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"auth.{key}: {value!r} must be a non-empty string")
    algorithm = raw.get("algorithm", "hmac-sha256")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"auth.algorithm: {algorithm!r}; use {' or '.join(ALGORITHMS)}")
    if algorithm == "blake3":
        try:
            import blake3  # noqa: F401
        except ImportError:
            raise ConfigError("auth.algorithm: blake3 needs the blake3 package (pip install blake3), "
                              "or use hmac-sha256") from None
    return AuthConfig(file, env, algorithm)


class RecordTagger:
    """Computes and checks the 16-byte tag of a block record."""

    def __init__(self, secret: bytes | None = None, namespace: str = "", algorithm: str = "hmac-sha256") -> None:
        self._secret = secret
        self._prefix = namespace.encode() + b"\0"
        self.algorithm = algorithm if secret is not None else "xxh3-128"
        self._blake3 = None
        if secret is not None and algorithm == "blake3":
            import blake3

            self._blake3 = blake3.blake3
            self._key32 = hashlib.sha256(secret).digest()  # BLAKE3's keyed mode takes 32 bytes

    @property
    def authenticated(self) -> bool:
        return self._secret is not None

    @property
    def key_id(self) -> str:
        """Names the secret without revealing it ("none" without one)."""
        if self._secret is None:
            return "none"
        return hashlib.blake2b(self._secret, digest_size=6, person=b"kvoffload-keyid").hexdigest()

    def tag(self, key: bytes, payload: bytes | memoryview) -> bytes:
        secret = self._secret
        if secret is None:
            return xxhash.xxh3_128_digest(payload)
        head = self._prefix + len(key).to_bytes(2, "little") + key
        if self._blake3 is not None:
            h = self._blake3(head, key=self._key32)
            h.update(payload)
            return h.digest(TAG_BYTES)
        mac = hmac.new(secret, head, "sha256")
        mac.update(payload)
        return mac.digest()[:TAG_BYTES]

    def check(self, key: bytes, payload: bytes | memoryview, tag: bytes) -> bool:
        return hmac.compare_digest(self.tag(key, payload), tag)

    @property
    def failure_reason(self) -> str:
        """The reason a record whose tag does not match is counted under."""
        return "auth" if self._secret is not None else "checksum"
