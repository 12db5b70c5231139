"""KeyValueStore: a shared key-value store as a shared-store tier sees it (Mooncake Store, or a test
double). Every call is batched, because a round trip per block would cost more than the copy,
and moves bytes between the store and memory the caller owns (registered once), so no block is
copied into a Python object on the way.

Status codes follow the store: per key, ``exists`` gives 1 / 0 / negative (error); ``put_from``
gives 0 or negative (a key some replica already wrote counts as 0); ``get_into`` gives the bytes read or negative.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class KeyValueStore(ABC):
    #: How log lines name the store, e.g. "mooncake store at 127.0.0.1:50051".
    name: str = "store"

    @abstractmethod
    def exists(self, keys: list[str]) -> list[int]:
        """Per key: 1 present, 0 absent, negative on error."""

    @abstractmethod
    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        """Store ``sizes[i]`` bytes at address ``ptrs[i]`` under ``keys[i]``; per key 0 or negative."""

    @abstractmethod
    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        """Read each value into ``ptrs[i]`` (room for ``sizes[i]`` bytes); per key bytes read or negative."""

    @abstractmethod
    def put_from_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        """``put_from`` of values gathered from several pieces each (a header, then the block)."""

    @abstractmethod
    def get_into_parts(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        """``get_into`` scattering each value over several pieces, in order."""

    @property
    def needs_registration(self) -> bool:
        """Memory must be ``register``-ed before the store reads or writes it (RDMA); when
        False, any host memory serves, and callers skip their staging copies."""
        return True

    def remove(self, keys: list[str]) -> None:
        """Delete values found unusable, so a good copy can be written again (best effort)."""

    def unreachable(self, status: int) -> bool:
        """The status means the store could not be reached (an outage), not "no such value"."""
        return False

    def register(self, ptr: int, size: int) -> None:
        """Make memory usable by put_from/get_into (RDMA needs it; default: nothing)."""

    def unregister(self, ptr: int) -> None:
        """Undo ``register``."""

    def close(self) -> None:
        """Leave the store (memory this process lent it goes with it)."""
