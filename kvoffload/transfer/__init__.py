"""Worker-side transfers: canonical KV layouts, stream pools, handlers per media pair."""

from kvoffload.transfer.handler import OffloadingHandler, TransferResult, TransferRouter, TransferSpec
from kvoffload.transfer.layout import CanonicalKVCache, LayoutError, canonicalize
from kvoffload.transfer.streams import DEVICE_TO_HOST, HOST_TO_DEVICE, CPUStreamPool, make_stream_pool

__all__ = [
    "DEVICE_TO_HOST",
    "HOST_TO_DEVICE",
    "CPUStreamPool",
    "CanonicalKVCache",
    "LayoutError",
    "OffloadingHandler",
    "TransferResult",
    "TransferRouter",
    "TransferSpec",
    "canonicalize",
    "make_stream_pool",
]
