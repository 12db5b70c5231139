"""KVEventTranslator: the tiers' store and eviction events as vLLM's KV events, ready for routers.

A tier knows a block only by its offload key; a KV-aware router indexes the engine's block
hashes, chained by parent, with their tokens. So when the scheduler half plans a store or a load
it describes each offloaded block from its request (the engine hash of every engine block it
spans, the hash before it, its tokens, adapter and session), and keeps the description while any
tier holds the block: stored events publish it, removals name the same hashes.

Routers do not reference-count announcements (Dynamo 1.6.1 forgets a block at its first removal
in a medium however often it was stored there), so each block is announced once per event
medium and removed only when no tier of that medium holds it any more. A reset removes every
announced block (its keys are never served again) and leaves the device's blocks alone.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from kvoffload.connector.base import EngineRequest
from kvoffload.kv_events import LOCAL, BlockRemoved, BlockStored, ExternalBlockHash, KVEvent, external_block_hash
from kvoffload.offload.abstract import BlockHash, Medium, OffloadingEvent
from kvoffload.offload.event_queue import EventQueue

#: Translated events kept for ``take_events``; older ones are dropped (nobody is draining).
MAX_QUEUED_KV_EVENTS = 100_000


@dataclass(frozen=True, slots=True)
class EventTags:
    """What a request adds to its blocks' events beyond tokens (vLLM's fields of the same name)."""

    lora_id: int | None = None
    lora_name: str | None = None
    session_id: str | None = None


#: A request's tags (an engine with adapters or sessions supplies one).
RequestTags = Callable[[EngineRequest], EventTags]
#: An engine block hash as events carry it (vLLM: ``maybe_convert_block_hash``).
ExternalHash = Callable[[Hashable], ExternalBlockHash]

NO_TAGS = EventTags()


@dataclass(slots=True)
class _Described:
    hashes: tuple[ExternalBlockHash, ...]
    parent: ExternalBlockHash | None
    tokens: array[int]
    tags: EventTags
    group: int
    #: Tier media (not event names) holding the block now.
    residency: set[str]


def _where(medium: str) -> tuple[str, str | None]:
    """(event medium, locality): a shared store is reachable from every replica, so it carries
    no locality relative to this one."""
    m = Medium.of(medium)
    return m.event_name, None if m.shared else LOCAL


class KVEventTranslator:
    def __init__(self, enabled: bool, block_size: int, factor: int, request_tags: RequestTags | None = None,
                 external_hash: ExternalHash | None = None) -> None:
        self.enabled = enabled
        self.block_size = block_size
        self.factor = factor
        self._tags = request_tags or (lambda _request: NO_TAGS)
        self._external = external_hash or external_block_hash
        self._described: dict[BlockHash, _Described] = {}
        #: Keys that may hold no tier any more: dropped once no job is moving them.
        self._unheld: set[BlockHash] = set()
        self._out: EventQueue[KVEvent] = EventQueue(
            MAX_QUEUED_KV_EVENTS, "kvoffload", "the engine's event publisher must call take_events() every step")
        #: Tier events about blocks never described (stored before this process, or by a copy
        #: planned before a reset): not published.
        self.num_undescribed = 0

    def describe(self, request: EngineRequest, group: int, blocks: Iterable[tuple[int, BlockHash]]) -> None:
        """Describe offloaded blocks of ``request``: (index of the offloaded block, its key in
        ``group``), before a store or load of them is planned."""
        if not self.enabled:
            return
        f, bs = self.factor, self.block_size
        engine_hashes: Sequence[Hashable] = request.block_hashes
        tags: EventTags | None = None
        for index, key in blocks:
            if key in self._described:
                continue
            if tags is None:
                tags = self._tags(request)
            lo, hi = index * f, (index + 1) * f
            self._described[key] = _Described(
                hashes=tuple(self._external(h) for h in engine_hashes[lo:hi]),
                parent=self._external(engine_hashes[lo - 1]) if lo else None,
                tokens=array("q", request.all_token_ids[lo * bs : hi * bs]),
                tags=tags, group=group, residency=set())
            self._unheld.add(key)

    def absorb(self, events: Iterable[OffloadingEvent], busy: Callable[[], set[BlockHash]]) -> None:
        """Translate the tiers' events (in order); ``busy``: keys of the copies in flight, whose
        descriptions stay though no tier holds them yet."""
        if not self.enabled:
            return
        for ev in events:
            if ev.removed:
                self._removed(ev.block_hashes, ev.medium)
            else:
                self._stored(ev.block_hashes, ev.medium)
        if self._unheld:
            moving = busy()
            for key in [k for k in self._unheld if k not in moving]:
                d = self._described.get(key)
                if d is None or not d.residency:
                    self._described.pop(key, None)
                self._unheld.discard(key)

    def reset(self) -> None:
        """Every announced block is gone (a cache reset re-keys the tiers): remove them all."""
        by_where: dict[tuple[str, str | None, int], list[ExternalBlockHash]] = {}
        for d in self._described.values():
            for name, locality in {_where(m) for m in d.residency}:
                by_where.setdefault((name, locality, d.group), []).extend(d.hashes)
        for (name, locality, group), hashes in by_where.items():
            self._out.put(BlockRemoved(block_hashes=hashes, medium=name, group_idx=group, locality=locality))
        self._described.clear()
        self._unheld.clear()

    @property
    def num_events_dropped(self) -> int:
        return self._out.num_dropped

    def take(self) -> list[KVEvent]:
        return self._out.take()

    def _stored(self, keys: list[BlockHash], medium: str) -> None:
        name, locality = _where(medium)
        for key in keys:
            d = self._described.get(key)
            if d is None:
                self.num_undescribed += 1
                continue
            announced = any(_where(m)[0] == name for m in d.residency)
            d.residency.add(medium)
            self._unheld.discard(key)
            if not announced:
                self._out.put(BlockStored(
                    block_hashes=list(d.hashes), parent_block_hash=d.parent, token_ids=d.tokens.tolist(),
                    block_size=self.block_size, lora_id=d.tags.lora_id, medium=name, lora_name=d.tags.lora_name,
                    group_idx=d.group, locality=locality, session_id=d.tags.session_id))

    def _removed(self, keys: list[BlockHash], medium: str) -> None:
        name, locality = _where(medium)
        by_group: dict[int, list[ExternalBlockHash]] = {}
        for key in keys:
            d = self._described.get(key)
            if d is None or medium not in d.residency:
                continue
            d.residency.discard(medium)
            if not d.residency:
                self._unheld.add(key)
            if any(_where(m)[0] == name for m in d.residency):
                continue  # another tier of the same event medium still holds it
            by_group.setdefault(d.group, []).extend(d.hashes)
        for group, hashes in by_group.items():
            self._out.put(BlockRemoved(block_hashes=hashes, medium=name, group_idx=group, locality=locality))


__all__ = ["MAX_QUEUED_KV_EVENTS", "NO_TAGS", "EventTags", "ExternalHash", "KVEventTranslator", "RequestTags"]
