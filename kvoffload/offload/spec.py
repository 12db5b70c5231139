"""OffloadingSpec: the seam between the connector and an offload backend.

A spec is built from the offload config and the engine's KV geometry; the scheduler half of
the connector asks it for the manager, the worker half for the transfer handlers. Specs are
found by ``spec_name`` (built-ins and the ``kvoffload.specs`` entry points) or loaded from
``spec_module_path`` (a module defining a class named ``spec_name``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

from kvoffload.config import OffloadConfig
from kvoffload.errors import UnknownPluginError
from kvoffload.kv_info import EngineKVInfo
from kvoffload.offload.abstract import LoadStoreSpec, OffloadingManager
from kvoffload.registry import SPECS

__all__ = ["EngineKVInfo", "OffloadingSpec", "OffloadingSpecFactory"]


class OffloadingSpec(ABC):
    def __init__(self, config: OffloadConfig, kv_info: EngineKVInfo) -> None:
        self.config = config
        self.kv_info = kv_info
        self.block_size_factor = config.block_size_factor(kv_info.block_size)
        self.offloaded_block_size = kv_info.block_size * self.block_size_factor
        self.offloaded_block_bytes = kv_info.block_bytes * self.block_size_factor

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        """The scheduler-side manager (built once, by the scheduler half)."""

    @abstractmethod
    def get_handlers(self, kv_caches: object) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], object]]:
        """Worker-side handlers as (src spec type, dst spec type, handler) over the worker's
        ``CanonicalKVCache``; each handler is an ``OffloadingHandler`` (the copy layer sits above
        this one, so the worker half checks that, not the type system here)."""


class OffloadingSpecFactory:
    """Specs by name, through the generic ``kvoffload.registry.SPECS``."""

    @staticmethod
    def register_spec(name: str, target: str) -> None:
        SPECS.register(name, target)

    @staticmethod
    def get_spec_class(spec_name: str, spec_module_path: str | None = None) -> type[OffloadingSpec]:
        name = f"{spec_module_path}:{spec_name}" if spec_module_path else spec_name
        try:
            return SPECS.load(name)
        except UnknownPluginError as exc:
            raise UnknownPluginError(f"spec_name: {exc}; or set spec_module_path") from None

    @classmethod
    def create_spec(cls, config: OffloadConfig, kv_info: EngineKVInfo) -> OffloadingSpec:
        return cls.get_spec_class(config.spec_name, config.spec_module_path)(config, kv_info)
