"""EventQueue: events waiting for a consumer that may never come.

Tiers queue their store and eviction events, and the scheduler half queues them translated for
vLLM's publisher; nothing guarantees a drain (events are on, nobody calls ``take_events``). So
a queue keeps at most ``limit`` events, drops the oldest past it, counts them and says so once.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EventQueue(Generic[T]):
    def __init__(self, limit: int, owner: str, fix: str) -> None:
        self.limit = limit
        self._owner = owner  # who queues, for the warning
        self._fix = fix  # what the user must do about it
        self._items: deque[T] = deque()
        self.num_dropped = 0

    def put(self, item: T) -> None:
        if len(self._items) >= self.limit:
            self._items.popleft()
            if not self.num_dropped:
                logger.warning("%s: %d KV events queued and not taken; dropping the oldest (%s)", self._owner,
                               self.limit, self._fix)
            self.num_dropped += 1
        self._items.append(item)

    def take(self) -> list[T]:
        """Every queued event, oldest first; the queue is empty after."""
        items = list(self._items)
        self._items.clear()
        return items

    def __len__(self) -> int:
        return len(self._items)


__all__ = ["EventQueue"]
