"""StoreLookups: "how many leading blocks does the store hold?", answered within a step.

The scheduler must never wait on the network: a query runs on one background thread, the
caller waits at most ``wait_s`` for it, and an unanswered query says "ask again next step"
(the answer is kept for that). A store that stops answering for ``give_up_s`` turns every new
query into a miss until it answers again, so a dead or hung store costs hits, never a stall.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout

from kvoffload.offload.abstract import BlockHash
from kvoffload.tiers.store.keys import StoreKeys
from kvoffload.tiers.store.kv_store import KeyValueStore

logger = logging.getLogger(__name__)

#: Longest run one query asks for (a 64k-token prompt in 16-token blocks).
MAX_QUERY_BLOCKS = 4096
#: A store error, as a query's answer.
STORE_ERROR = -1


class StoreLookups:
    def __init__(self, store: KeyValueStore, keys: StoreKeys, wait_s: float = 0.005, give_up_s: float = 0.5,
                 answer_ttl_s: float = 1.0, max_answers: int = 1024) -> None:
        self.store = store
        self.keys = keys
        self.wait_s = wait_s
        self.give_up_s = give_up_s
        self.answer_ttl_s = answer_ttl_s
        self.max_answers = max_answers
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvoffload-store-lookup")
        self._lock = threading.Lock()
        self._pending: dict[tuple[BlockHash, ...], tuple[Future[int], float]] = {}
        self._answers: OrderedDict[tuple[BlockHash, ...], tuple[int, float]] = OrderedDict()
        self.num_queries = 0
        self.num_deferred = 0
        self.num_given_up = 0

    def leading_run(self, block_hashes: Sequence[BlockHash]) -> int | None:
        """Leading blocks the store holds for every rank, STORE_ERROR if it failed, None: ask again."""
        query = tuple(block_hashes[:MAX_QUERY_BLOCKS])
        if not query:
            return 0
        now = time.monotonic()
        with self._lock:
            answer = self._answers.pop(query, None)
            if answer is not None and now - answer[1] < self.answer_ttl_s:
                return answer[0]
            pending = self._pending.get(query)
            if pending is None:
                if any(now - t0 > self.give_up_s for _, t0 in self._pending.values()):
                    self.num_given_up += 1
                    return 0  # the store is not answering: miss rather than queue behind it
                future = self._pool.submit(self._ask, query)
                self._pending[query] = (future, now)
                self.num_queries += 1
            else:
                future = pending[0]
        try:
            n = future.result(timeout=self.wait_s)
        except FutureTimeout:
            self.num_deferred += 1
            return None  # kept in _answers when it arrives, for the next step's call
        with self._lock:
            self._answers.pop(query, None)  # delivered now: the next call asks afresh
        return n

    def _ask(self, query: tuple[BlockHash, ...]) -> int:
        try:
            found = self.store.exists(self.keys.all_rank_keys(query))
        except Exception:  # noqa: BLE001 - a store client may raise anything; it is a failed query
            found = [STORE_ERROR]
        world = self.keys.world_size
        n = 0
        for i in range(len(query)):
            shards = found[i * world : (i + 1) * world]
            if len(shards) < world or any(s < 0 for s in shards):
                n = STORE_ERROR if n == 0 else n
                break
            if not all(s == 1 for s in shards):
                break
            n += 1
        with self._lock:
            self._pending.pop(query, None)
            self._answers[query] = (n, time.monotonic())
            while len(self._answers) > self.max_answers:
                self._answers.popitem(last=False)
        return n

    def forget(self) -> None:
        """Drop cached answers (the store's contents changed under us, e.g. it restarted)."""
        with self._lock:
            self._answers.clear()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop asking and leave the store (this client is the lookups' own). A query still
        running keeps the client: closing it under the query would crash the process."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            running = [f for f, _ in self._pending.values() if not f.cancelled()]
        _, stuck = wait(running, timeout=timeout_s)
        if stuck:
            logger.warning("%s: a lookup did not return within %.0f s; leaving its client open", self.store.name,
                           timeout_s)
            return
        self._pool.shutdown(wait=True)  # nothing runs: its idle thread ends now, not after we return
        self.store.close()
