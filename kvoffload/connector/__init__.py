"""Connector layer: the contract the engine speaks, and the offloading connector."""

from kvoffload.connector.base import (
    KVConnectorBase,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
)

__all__ = ["KVConnectorBase", "KVConnectorMetadata", "KVConnectorOutput", "KVConnectorRole"]
