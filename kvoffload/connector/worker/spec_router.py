"""spec_router: the copies an OffloadingSpec's handlers make, as one router over the worker's
KV caches: each (source, destination) spec pair to the handler the spec gives for it, each
handler checked to be an OffloadingHandler (a spec is user code: a wrong type fails here, by
name, not at the first copy)."""

from __future__ import annotations

from kvoffload.offload.spec import OffloadingSpec
from kvoffload.transfer.handler import OffloadingHandler, TransferRouter
from kvoffload.transfer.layout import CanonicalKVCache


def spec_router(spec: OffloadingSpec, kv: CanonicalKVCache) -> TransferRouter:
    router = TransferRouter()
    for src, dst, handler in spec.get_handlers(kv):
        if not isinstance(handler, OffloadingHandler):
            raise TypeError(f"{type(spec).__name__}.get_handlers gave {type(handler).__name__} for "
                            f"{src.__name__} -> {dst.__name__}; a handler must subclass OffloadingHandler")
        router.register_handler(src, dst, handler)
    return router
