"""Connector layer: the contract the engine speaks, and the offloading connector."""

from typing import TYPE_CHECKING

from kvoffload.connector.base import (
    KVConnectorBase,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
)
from kvoffload.connector.factory import KVConnectorFactory

if TYPE_CHECKING:
    from kvoffload.connector.offloading_connector import OffloadingConnector

__all__ = [
    "KVConnectorBase",
    "KVConnectorFactory",
    "KVConnectorMetadata",
    "KVConnectorOutput",
    "KVConnectorRole",
    "OffloadingConnector",
]


def __getattr__(name: str) -> type:
    # Lazy, so the engine importing the contract does not pull in the offload stack.
    if name == "OffloadingConnector":
        from kvoffload.connector.offloading_connector import OffloadingConnector

        return OffloadingConnector
    raise AttributeError(name)
