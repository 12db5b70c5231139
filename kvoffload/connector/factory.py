"""Build connectors by name: built-in registry, ``module:Class`` paths, or entry points.

Built-ins are registered as import strings so naming one imports nothing else. Plugins add
names through the ``kvoffload.connectors`` entry-point group.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from kvoffload.connector.base import KVConnectorBase, KVConnectorRole
from kvoffload.registry import load_object

ENTRY_POINT_GROUP = "kvoffload.connectors"

_REGISTRY: dict[str, str] = {
    "OffloadingConnector": "kvoffload.connector.offloading_connector:OffloadingConnector",
}


def register_connector(name: str, target: str) -> None:
    """Register ``name`` → ``"module:Class"`` (imported on first use)."""
    _REGISTRY[name] = target


def _import_target(target: str) -> Any:
    return load_object(target, ValueError, "connector")


def known_connectors() -> list[str]:
    names = set(_REGISTRY)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def get_connector_class(name: str) -> type[KVConnectorBase]:
    if name in _REGISTRY:
        cls = _import_target(_REGISTRY[name])
    elif ":" in name:
        cls = _import_target(name)
    else:
        matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not matches:
            raise ValueError(f"unknown connector {name!r}; known: {', '.join(known_connectors())} (or module:Class)")
        cls = matches[0].load()
    if not (isinstance(cls, type) and issubclass(cls, KVConnectorBase)):
        raise TypeError(f"connector {name!r} resolved to {cls!r}, which is not a KVConnectorBase subclass")
    return cls


class KVConnectorFactory:
    @staticmethod
    def create_connector(name: str, config: Any, role: KVConnectorRole, **kwargs: Any) -> KVConnectorBase:
        """One instance per role; the connector builds only the half that role needs."""
        return get_connector_class(name)(config, role, **kwargs)
