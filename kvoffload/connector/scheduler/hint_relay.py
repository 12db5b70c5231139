"""HintRelay: a request's hint, from the engine's request to the tiers' policies.

The hint is read once per request from ``kv_transfer_params["kvoffload"]`` (vLLM passes the
OpenAI body's ``kv_transfer_params`` through; the bundled engine's ``add_request(hint=...)`` sets
the same) and given to the tiers twice: with the blocks of the request's prompt when it is first
looked up (the blocks it reuses, and those it will store: a policy holds a hint for a block
stored after it), and with all its blocks when it finishes, now that its finish is known. A
request whose output holds a tool-call token (``hints.tool_call_token_ids``) ended in a tool
call: its caller is expected back within ``hints.tool_return_s``, unless the hint said when. A
request without a hint and without a tool call gives the tiers nothing.

A hint is client input: its session is scoped to the request's tenant (its ``cache_salt``, its
LoRA adapter, and the ``kv_transfer_params`` entries the operator names in
``hints.tenant_keys``), so a client naming another tenant's session reaches nothing of theirs;
its priority is capped at ``hints.max_priority``; and it is parsed by ``parse_hint``, which
never raises, so no hint can fail a scheduler step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from kvoffload.config import HintsConfig
from kvoffload.connector.base import EngineRequest, RequestSalt
from kvoffload.connector.scheduler.request_state import RequestOffloadState, TenantHint
from kvoffload.connector.scheduler.scheduler_stats import SchedulerSideStats
from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.chain import TierChain
from kvoffload.offload.hints import RequestHint, parse_hint, tenant_digest


class HintRelay:
    def __init__(self, manager: TierChain, config: HintsConfig, stats: SchedulerSideStats,
                 clock: Callable[[], float] = time.monotonic, request_salt: RequestSalt | None = None) -> None:
        self.manager = manager
        self.stats = stats
        self.tool_tokens = frozenset(config.tool_call_token_ids)
        self.tool_return_s = config.tool_return_s
        self.max_priority = config.max_priority
        self.tenant_keys = config.tenant_keys
        #: The adapter's digest of a request (a LoRA tenant), as its offload keys carry it.
        self.request_salt = request_salt
        speed = config.clock_speed
        #: The hints' clock: wall time, sped up for a trace replayed faster than it happened.
        self.clock = clock if speed == 1.0 else (lambda: clock() * speed)

    def _of(self, request: EngineRequest, state: RequestOffloadState) -> TenantHint | None:
        """The request's hint, read once (kept on its record)."""
        if not state.hint_read:
            state.hint_read = True
            params = request.kv_transfer_params
            hint = parse_hint(params.get("kvoffload"), self.max_priority) if isinstance(params, Mapping) else None
            state.hint = None if hint is None else TenantHint(hint, self._tenant(request, params))
            self.stats.hinted_requests += state.hint is not None
        return state.hint

    def _tenant(self, request: EngineRequest, params: Mapping[str, object] | None) -> bytes:
        extra = [params.get(k) if params is not None else None for k in self.tenant_keys]
        adapter = self.request_salt(request) if self.request_salt is not None else None
        return tenant_digest([request.cache_salt, adapter, *extra])

    def looked_up(self, request: EngineRequest, state: RequestOffloadState,
                  keys: Sequence[Sequence[BlockHash]]) -> None:
        """The request's first lookup (``LoadPlanner`` calls it once, after touching ``keys``,
        its prompt's keys per KV-cache group: a waiting request's later lookups are not news)."""
        found = self._of(request, state)
        if found is not None:
            self._give(keys, found.hint, found.tenant)

    def finished(self, request: EngineRequest, state: RequestOffloadState,
                 keys: Callable[[], Sequence[Sequence[BlockHash]]]) -> None:
        """The engine finished the request (done, aborted or failed); ``keys``: all its blocks'."""
        found = self._of(request, state)
        hint, tenant = (found.hint, found.tenant) if found is not None else (None, b"")
        if self.tool_tokens and not self.tool_tokens.isdisjoint(request.output_token_ids):
            self.stats.tool_call_finishes += 1
            if hint is None or hint.expect_return_s is None:
                hint = replace(hint or RequestHint(), expect_return_s=self.tool_return_s)
        if hint is not None:
            self._give(keys(), hint, tenant)

    def _give(self, keys: Sequence[Sequence[BlockHash]], hint: RequestHint, tenant: bytes) -> None:
        # One call for all groups: a policy reads the keys as the request's chain, and a later
        # call for the same session replaces the chain it was given before.
        chain = [k for group in keys for k in group]
        if chain:
            self.manager.hint(chain, hint.at(self.clock(), tenant))
            self.stats.hints_given += 1
