"""HintBook: a request's hint, from the engine's request to the tiers' policies.

The hint is read once per request from ``kv_transfer_params["kvoffload"]`` (vLLM passes the
OpenAI body's ``kv_transfer_params`` through; the bundled engine's ``add_request(hint=...)`` sets
the same) and given to the tiers twice: with the blocks of the request's prompt when it is first
looked up (the blocks it reuses, and those it will store: a policy holds a hint for a block
stored after it), and with all its blocks when it finishes, now that its finish is known. A
request whose output holds a tool-call token (``hints.tool_call_token_ids``) ended in a tool
call: its caller is expected back within ``hints.tool_return_s``, unless the hint said when. A
request without a hint and without a tool call gives the tiers nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from kvoffload.config import HintsConfig
from kvoffload.connector.base import EngineRequest
from kvoffload.connector.scheduler_stats import SchedulerSideStats
from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.chain import TierChain
from kvoffload.offload.hints import RequestHint, parse_hint


class HintBook:
    def __init__(self, manager: TierChain, config: HintsConfig, stats: SchedulerSideStats,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.manager = manager
        self.stats = stats
        self.tool_tokens = frozenset(config.tool_call_token_ids)
        self.tool_return_s = config.tool_return_s
        speed = config.clock_speed
        #: The hints' clock: wall time, sped up for a trace replayed faster than it happened.
        self.clock = clock if speed == 1.0 else (lambda: clock() * speed)
        #: Per request seen and not finished: its parsed hint (None: it carries none).
        self._hints: dict[str, RequestHint | None] = {}

    def _of(self, request: EngineRequest) -> RequestHint | None:
        rid = request.request_id
        if rid in self._hints:
            return self._hints[rid]
        params = request.kv_transfer_params
        hint = parse_hint(params.get("kvoffload")) if isinstance(params, Mapping) else None
        self._hints[rid] = hint
        self.stats.hinted_requests += hint is not None
        return hint

    def looked_up(self, request: EngineRequest, keys: Sequence[Sequence[BlockHash]]) -> None:
        """The request's first lookup (``LoadPlanner`` calls it once, after touching ``keys``,
        its prompt's keys per KV-cache group: a waiting request's later lookups are not news)."""
        hint = self._of(request)
        if hint is not None:
            self._give(keys, hint)

    def finished(self, request: EngineRequest, keys: Callable[[], Sequence[Sequence[BlockHash]]]) -> None:
        """The engine finished the request (done, aborted or failed); ``keys``: all its blocks'."""
        hint = self._of(request)
        del self._hints[request.request_id]
        if self.tool_tokens and not self.tool_tokens.isdisjoint(request.output_token_ids):
            self.stats.tool_call_finishes += 1
            if hint is None or hint.expect_return_s is None:
                hint = replace(hint or RequestHint(), expect_return_s=self.tool_return_s)
        if hint is not None:
            self._give(keys(), hint)

    def _give(self, keys: Sequence[Sequence[BlockHash]], hint: RequestHint) -> None:
        # One call for all groups: a policy reads the keys as the request's chain, and a later
        # call for the same session replaces the chain it was given before.
        chain = [k for group in keys for k in group]
        if chain:
            self.manager.hint(chain, hint.at(self.clock()))
            self.stats.hints_given += 1
