"""An in-memory KeyValueStore for tests, with the faults a real store shows: slow or failed
answers, lost values. Fault injection lives here, not in production code."""

from __future__ import annotations

import ctypes
import threading
import time

from kvoffload.tiers.store.kv_store import KeyValueStore

UNREACHABLE = -900
NOT_FOUND = -704


class DictStore(KeyValueStore):
    name = "dict store"

    def __init__(self, needs_registration: bool = True) -> None:
        self._needs_registration = needs_registration
        self.values: dict[str, bytes] = {}
        self.calls: list[tuple[str, int]] = []  # (method, number of keys)
        self.down = False  # every call fails as unreachable
        self.down_after_s = 0.0  # ... after this long (a timeout)
        self.gate: threading.Event | None = None  # exists() waits for it (a slow store)
        self.registered: list[tuple[int, int]] = []

    def _fails(self) -> bool:
        """Whether this call fails as unreachable (after ``down_after_s``, as a timeout would)."""
        if self.down and self.down_after_s:
            time.sleep(self.down_after_s)
        return self.down

    def exists(self, keys: list[str]) -> list[int]:
        self.calls.append(("exists", len(keys)))
        if self.gate is not None:
            self.gate.wait()
        if self.down:
            return [UNREACHABLE] * len(keys)
        return [int(k in self.values) for k in keys]

    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self.calls.append(("put", len(keys)))
        if self._fails():
            return [UNREACHABLE] * len(keys)
        for k, p, n in zip(keys, ptrs, sizes):
            self.values.setdefault(k, ctypes.string_at(p, n))
        return [0] * len(keys)

    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self.calls.append(("get", len(keys)))
        self._fails()
        out = []
        for k, p, n in zip(keys, ptrs, sizes):
            if self.down:
                out.append(UNREACHABLE)
            elif k not in self.values:
                out.append(NOT_FOUND)
            else:
                value = self.values[k][:n]
                ctypes.memmove(p, value, len(value))
                out.append(len(value))
        return out

    def put_from_parts(self, keys, ptrs, sizes):
        self.calls.append(("put_parts", len(keys)))
        if self._fails():
            return [UNREACHABLE] * len(keys)
        for k, ps, ns in zip(keys, ptrs, sizes):
            self.values.setdefault(k, b"".join(ctypes.string_at(p, n) for p, n in zip(ps, ns)))
        return [0] * len(keys)

    def get_into_parts(self, keys, ptrs, sizes):
        self.calls.append(("get_parts", len(keys)))
        self._fails()
        out = []
        for k, ps, ns in zip(keys, ptrs, sizes):
            if self.down:
                out.append(UNREACHABLE)
            elif k not in self.values:
                out.append(NOT_FOUND)
            else:
                value, at = self.values[k], 0
                for p, n in zip(ps, ns):
                    piece = value[at : at + n]
                    ctypes.memmove(p, piece, len(piece))
                    at += n
                out.append(min(len(value), sum(ns)))
        return out

    def remove(self, keys: list[str]) -> None:
        self.calls.append(("remove", len(keys)))
        for k in keys:
            self.values.pop(k, None)

    def unreachable(self, status: int) -> bool:
        return status == UNREACHABLE

    @property
    def needs_registration(self) -> bool:
        return self._needs_registration

    def register(self, ptr: int, size: int) -> None:
        self.registered.append((ptr, size))
