"""Build connectors by name (the generic ``kvoffload.registry.CONNECTORS``): built-ins,
``module:Class`` paths, or the ``kvoffload.connectors`` entry points."""

from __future__ import annotations

from kvoffload.connector.base import KVConnectorBase, KVConnectorRole
from kvoffload.registry import CONNECTORS

ENTRY_POINT_GROUP = CONNECTORS.group


def register_connector(name: str, target: str) -> None:
    """Register ``name`` → ``"module:Class"`` (imported on first use)."""
    CONNECTORS.register(name, target)


def get_connector_class(name: str) -> type[KVConnectorBase]:
    return CONNECTORS.load(name)


class KVConnectorFactory:
    @staticmethod
    def create_connector(name: str, config: object, role: KVConnectorRole, **kwargs: object) -> KVConnectorBase:
        """One instance per role; the connector builds only the half that role needs."""
        return get_connector_class(name)(config, role, **kwargs)
