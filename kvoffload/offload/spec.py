"""OffloadingSpec: the seam between the connector and an offload backend.

A spec is built from the offload config and the engine's KV geometry; the scheduler half of
the connector asks it for the manager, the worker half for the transfer handlers. Specs are
found by ``spec_name`` (built-ins and the ``kvoffload.specs`` entry points) or loaded from
``spec_module_path`` (a module defining a class named ``spec_name``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from kvoffload.offload.abstract import LoadStoreSpec, OffloadingManager
from kvoffload.registry import load_object

if TYPE_CHECKING:
    from kvoffload.config import OffloadConfig

ENTRY_POINT_GROUP = "kvoffload.specs"


@dataclass(frozen=True, slots=True)
class EngineKVInfo:
    """What the backend must know about the engine's KV cache, and nothing more."""

    block_size: int  # tokens per engine block
    block_bytes: int  # bytes of one engine block across all layers (K and V)
    num_device_blocks: int = 0  # engine blocks in the device KV cache
    layout_digest: str = ""  # identifies model + layout, so persistent tiers never misread
    #: Ranks that each hold a shard of every block (tensor x pipeline parallel), and this
    #: process's rank among them (workers; the scheduler side serves all ranks). ``block_bytes``
    #: is one rank's share.
    world_size: int = 1
    rank: int = 0


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
    def get_handlers(self, kv_caches: Any) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], Any]]:
        """Worker-side handlers as (src spec type, dst spec type, handler)."""


_REGISTRY: dict[str, str] = {
    "CPUOffloadingSpec": "kvoffload.offload.cpu_spec:CPUOffloadingSpec",
}


class OffloadingSpecFactory:
    @staticmethod
    def register_spec(name: str, target: str) -> None:
        _REGISTRY[name] = target

    @staticmethod
    def get_spec_class(spec_name: str, spec_module_path: str | None = None) -> type[OffloadingSpec]:
        from kvoffload.config import ConfigError

        if spec_module_path:
            target = f"{spec_module_path}:{spec_name}"
        elif spec_name in _REGISTRY:
            target = _REGISTRY[spec_name]
        else:
            eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec_name]
            if not eps:
                known = sorted(set(_REGISTRY) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
                raise ConfigError(f"spec_name: unknown spec {spec_name!r}; known: {', '.join(known)}, or set spec_module_path")
            target = eps[0].value
        cls = load_object(target, ConfigError, "spec_module_path")
        if not (isinstance(cls, type) and issubclass(cls, OffloadingSpec)):
            raise ConfigError(f"spec_name: {target!r} is not an OffloadingSpec subclass")
        return cls

    @classmethod
    def create_spec(cls, config: OffloadConfig, kv_info: EngineKVInfo) -> OffloadingSpec:
        return cls.get_spec_class(config.spec_name, config.spec_module_path)(config, kv_info)
