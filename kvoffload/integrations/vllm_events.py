"""kvoffload's KV events as vLLM's own (``vllm.distributed.kv_events``), so ``--kv-events-config``
publishes them in the batch with the device cache's and routers decode them with vLLM's schema.

The scheduler half builds them (``connector/scheduler/kv_event_translator.py``); here they get vLLM's hash form
(``maybe_convert_block_hash``: the same integers vLLM publishes for the device blocks), the
request's adapter and session, and vLLM's struct of the same name, field by field.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from kvoffload import kv_events
from kvoffload.connector.scheduler.kv_event_translator import EventTags
from kvoffload.kv_events import ExternalBlockHash


def vllm_block_hash(block_hash: Hashable) -> ExternalBlockHash:
    """A vLLM block hash as vLLM's own events carry it."""
    return maybe_convert_block_hash(block_hash)


def vllm_request_tags(request: Any) -> EventTags:
    """The adapter and session vLLM's device events carry for ``request``."""
    lora = request.lora_request
    return EventTags(lora_id=lora.adapter_id if lora is not None else None,
                     lora_name=lora.name if lora is not None else None,
                     session_id=getattr(request, "session_id", None))


def vllm_events(events: Iterable[kv_events.KVEvent]) -> Iterator[KVCacheEvent]:
    for ev in events:
        if isinstance(ev, kv_events.BlockStored):
            yield BlockStored(block_hashes=list(ev.block_hashes), parent_block_hash=ev.parent_block_hash,
                              token_ids=list(ev.token_ids), block_size=ev.block_size, lora_id=ev.lora_id,
                              medium=ev.medium, lora_name=ev.lora_name, group_idx=ev.group_idx,
                              locality=ev.locality, session_id=ev.session_id)
        elif isinstance(ev, kv_events.BlockRemoved):
            yield BlockRemoved(block_hashes=list(ev.block_hashes), medium=ev.medium, group_idx=ev.group_idx,
                               locality=ev.locality)
        else:
            yield AllBlocksCleared()


__all__ = ["vllm_block_hash", "vllm_events", "vllm_request_tags"]
