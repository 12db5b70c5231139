"""LLM: the user-facing facade that runs the scheduler and the model runner step by step."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kvoffload.config import OffloadConfig
from kvoffload.connector.base import KVConnectorBase, KVConnectorRole, RequestHint, parse_hint
from kvoffload.connector.factory import KVConnectorFactory
from kvoffload.engine.beam_search import BeamSearchController
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.device_memory import check_device_cache
from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.kv_namespace import engine_kv_info
from kvoffload.engine.model_config import BUILTIN_MODELS, ModelConfig
from kvoffload.engine.model_runner import ModelRunner
from kvoffload.engine.outputs import RequestOutput
from kvoffload.engine.prompts import Prompt, checked_request
from kvoffload.engine.request import Request
from kvoffload.engine.request_output import request_output
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.scheduler import Scheduler
from kvoffload.engine.stats import EngineStats
from kvoffload.engine.tokenizer import ByteTokenizer
from kvoffload.metrics import MetricsServer

#: Steps in a row with nothing scheduled and no transfer pending before the engine gives up.
_MAX_IDLE_STEPS = 100_000
#: An empty step sleeps this long: a caller's loop of them (waiting for loads) kept the GIL from
#: the copy threads (a 2 MiB disk load took 28-349 ms under one on 2 cores, 1.7 ms with the sleep).
_IDLE_STEP_SLEEP_S = 0.0002


class LLM:
    """The bundled engine: paged KV, prefix caching, chunked prefill, preemption, and offload to
    the tiers of ``EngineConfig.kv_offload`` through the offloading connector.

    ``generate(prompts, SamplingParams(...))`` runs prompts (token-id lists or strings) to
    completion and returns one :class:`RequestOutput` each; ``add_request`` + ``step`` +
    ``output_token_ids`` + ``collect`` drive it request by request (a server loop, streaming).
    ``stats()`` reports hits by tier and transfer counters (``stats_record()``: the same, typed);
    ``close()`` (or ``with LLM(...)``) drains in-flight copies and closes the tiers.
    """

    def __init__(self, config: EngineConfig | None = None, *, record_logits: bool = False, **overrides: Any) -> None:
        if config is None:
            config = EngineConfig(**overrides)
        elif overrides:
            raise TypeError("pass either an EngineConfig or keyword overrides, not both")
        self.config = config
        self.tokenizer = ByteTokenizer()
        if config.model in BUILTIN_MODELS:
            self.model_config = ModelConfig.tiny(config.model)
        else:
            self.model_config = ModelConfig.from_pretrained(config.model)
            if config.load_format == "dummy":
                self.model_config = dataclasses.replace(self.model_config, checkpoint_dir=None)
        self.kv_info = engine_kv_info(config, self.model_config)
        check_device_cache(self.model_config, config.num_gpu_blocks, config.block_size, getattr(torch, config.dtype),
                           torch.device(config.device))
        self.scheduler_connector: KVConnectorBase | None = None
        self.worker_connector: KVConnectorBase | None = None
        self.metrics_server: MetricsServer | None = None
        try:
            self._build(config, record_logits)
            port = OffloadConfig.coerce(config.kv_offload).metrics.prometheus_port if config.kv_offload else None
            if port is not None:
                self.metrics_server = MetricsServer(self.stats, port)
        except BaseException:
            self._close_connectors()  # a failed start must not keep the disk tier's lock or threads
            raise

    def _build(self, config: EngineConfig, record_logits: bool) -> None:
        self._build_connectors(config, self.kv_info)
        self.kv_cache_manager = KVCacheManager(
            config.num_gpu_blocks, config.block_size, config.max_model_len, config.enable_prefix_caching,
            windows=self.kv_info.group_windows,
        )
        self.scheduler = Scheduler(
            self.kv_cache_manager,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            enable_chunked_prefill=config.enable_chunked_prefill,
            policy=config.scheduling_policy,
            connector=self.scheduler_connector,
            watermark_blocks=int(config.watermark * config.num_gpu_blocks),
            preemption_mode=config.preemption_mode,
        )
        self.beams = BeamSearchController(self.scheduler)
        self.runner = ModelRunner(
            self.model_config,
            num_blocks=config.num_gpu_blocks,
            block_size=config.block_size,
            seed=config.seed,
            dtype=getattr(torch, config.dtype),
            device=config.device,
            connector=self.worker_connector,
            record_logits=record_logits,
        )
        self._ttfts: list[float] = []
        self._num_requests = 0
        self._prompt_tokens = 0
        self._generated_tokens = 0
        self._closed = False
        self.last_logits: dict[str, list[torch.Tensor]] = {}
        self._finished: dict[str, Request] = {}
        self._children: dict[str, list[str]] = {}
        self._open_groups: set[str] = set()

    def _build_connectors(self, config: EngineConfig, kv_info: Any) -> None:
        """Each half is kept as soon as it exists, so a failed start can close what was built."""
        name = config.kv_connector
        if name is None and config.kv_offload is None:
            return
        name = name or "OffloadingConnector"
        self.scheduler_connector = KVConnectorFactory.create_connector(name, config, KVConnectorRole.SCHEDULER, kv_info=kv_info)
        self.worker_connector = KVConnectorFactory.create_connector(name, config, KVConnectorRole.WORKER, kv_info=kv_info)

    # ---- requests ----------------------------------------------------------------------
    def _check_request(self, prompt: Prompt, params: SamplingParams, rid: str) -> list[int]:
        return checked_request(prompt, params, rid, self.tokenizer, self.model_config.vocab_size, self.config)

    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, priority: int = 0,
                    cache_salt: str | None = None, hint: RequestHint | Mapping[str, object] | None = None) -> str:
        """``hint``: what the caller knows of this request's future, for the offload policy
        (``RequestHint`` or its fields as a mapping: session, expect_return_s, priority,
        lease_s); a bad field is warned about once and ignored. It is validated here, where the
        request enters: nothing a client puts in it reaches a step unchecked."""
        if self._closed:
            raise RuntimeError("LLM is closed; create a new one")
        rid = request_id if request_id is not None else f"req-{self._num_requests}"
        token_ids = self._check_request(prompt, params, rid)
        parsed = parse_hint(hint)
        self._enqueue(rid, token_ids, params, priority, cache_salt,
                      None if parsed is None else {"kvoffload": parsed})
        self._open_groups.add(rid)  # step() reports it done; collect() hands its output over
        return rid

    def _enqueue(self, rid: str, token_ids: list[int], params: SamplingParams, priority: int = 0,
                 cache_salt: str | None = None, kv_transfer_params: dict[str, object] | None = None) -> str:
        cfg = self.config
        request = Request(
            request_id=rid,
            prompt_token_ids=token_ids,
            sampling_params=params,
            block_size=cfg.block_size,
            eos_token_id=self.model_config.eos_token_id,
            priority=priority,
            cache_salt=cache_salt,
            kv_transfer_params=kv_transfer_params,
            seed=(cfg.seed * 7919 + self._num_requests) & 0x7FFFFFFF,
        )
        self.scheduler.add_request(request)
        if params.beam_width:
            self.beams.add(request)
        self._num_requests += 1
        self._prompt_tokens += len(token_ids)
        return rid

    def step(self) -> list[str]:
        """One engine step; returns the ids of request groups that completed in it."""
        so = self.scheduler.schedule()
        out = self.runner.execute_model(so)
        if self.runner.record_logits:
            for rid, logit in out.logits.items():
                self.last_logits.setdefault(rid, []).append(logit)
        finished = self.scheduler.update_from_output(so, out)
        done = self.beams.on_step(out.beam_candidates)
        for parent, child in self.scheduler.forked:
            if not self.beams.is_beam(child):
                self._children.setdefault(parent, []).append(child)
        self.scheduler.forked.clear()
        for request in finished:
            self._finished[request.request_id] = request
        for rid in list(self._open_groups):
            if self.beams.is_beam(rid):
                continue
            members = [rid, *self._children.get(rid, [])]
            if all(m in self._finished for m in members):
                done.append(rid)
        for rid in done:
            self._open_groups.discard(rid)
        if not so.total_num_scheduled_tokens:
            time.sleep(_IDLE_STEP_SLEEP_S)
        return done

    def output_token_ids(self, request_id: str) -> list[int]:
        """The tokens ``request_id`` has generated so far, running or finished (a streaming caller's)."""
        request = self.scheduler.requests.get(request_id) or self._finished.get(request_id)
        return list(request.output_token_ids) if request is not None else []

    def collect(self, request_id: str) -> RequestOutput:
        """The output of a request :meth:`step` reported done, which the engine then forgets."""
        if request_id not in self._finished:
            raise KeyError(f"request {request_id!r} has not finished; call step() until it reports it done")
        self._record_finished(request_id)
        out = request_output(self._finished[request_id], self.tokenizer, self.beams, self._children, self._finished)
        self._forget(request_id)
        return out

    def _forget(self, request_id: str) -> None:
        """Drop a finished request group (its forks' records and its beams) once handed over."""
        for member in [request_id, *self._children.pop(request_id, [])]:
            self._finished.pop(member, None)
        self.beams.forget(request_id)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False, cache_salt: str | None = None) -> list[RequestOutput]:
        """Run the prompts to completion. ``cache_salt`` (a tenant's secret, as vLLM's) enters
        every block hash: only requests with the same salt share cached KV, in every tier."""
        single = isinstance(prompts, str) or (prompts and isinstance(prompts[0], int))
        batch: list[Prompt] = [prompts] if single else list(prompts)  # type: ignore[list-item, arg-type]
        prompts = batch
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, Sequence) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        if self._closed:
            raise RuntimeError("LLM is closed; create a new one")
        # The whole batch is checked before any request is enqueued: a bad prompt at position
        # i must not leave requests 0..i-1 running with nobody to collect them.
        checked = [self._check_request(p, sp, f"req-{self._num_requests + i}")
                   for i, (p, sp) in enumerate(zip(prompts, params))]
        rids = [self._enqueue(f"req-{self._num_requests}", ids, sp, cache_salt=cache_salt)
                for ids, sp in zip(checked, params)]
        requests = {rid: self.scheduler.requests[rid] for rid in rids}
        self._open_groups.update(rids)
        self._run_until_done(set(rids), use_tqdm)
        outs = [request_output(requests[rid], self.tokenizer, self.beams, self._children, self._finished)
                for rid in rids]
        for rid in rids:  # forget finished requests of this call
            self._forget(rid)
        return outs

    def _run_until_done(self, rids: set[str], use_tqdm: bool) -> None:
        pending = set(rids)
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(pending), desc="requests", unit="req")
        idle = 0
        try:
            while pending or self.scheduler.has_pending_frees() or self.scheduler.has_pending_transfers():
                finished = self.step()
                for rid in finished:
                    if rid in pending:
                        pending.discard(rid)
                        self._record_finished(rid)
                        if bar is not None:
                            bar.update(1)
                if finished or self.scheduler.stats.steps == 0:
                    idle = 0
                else:
                    idle += 1
                if idle > _MAX_IDLE_STEPS:
                    raise RuntimeError(f"engine made no progress for {_MAX_IDLE_STEPS} steps; pending {sorted(pending)[:5]}")
        finally:
            if bar is not None:
                bar.close()

    def _record_finished(self, root_id: str) -> None:
        members = [self._finished[m] for m in [root_id, *self._children.get(root_id, [])] if m in self._finished]
        self._generated_tokens += sum(r.num_output_tokens for r in members)
        root = members[0] if members else None
        if root is not None and root.first_token_time is not None:
            self._ttfts.append(root.first_token_time - root.arrival_time)

    # ---- lifecycle and reports ---------------------------------------------------------
    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        """Drop the device prefix cache (False while blocks are in use); with
        ``reset_connector`` also every offloaded block, as after a change of weights."""
        ok = self.kv_cache_manager.reset_prefix_cache()
        if reset_connector and self.scheduler_connector is not None:
            ok = self.scheduler_connector.reset_cache() is not False and ok
        return ok

    def stats(self) -> dict[str, Any]:
        s = self.scheduler.stats
        connector_stats = self.scheduler_connector.stats() if self.scheduler_connector else {}
        worker_stats = self.worker_connector.stats() if self.worker_connector else {}
        hits = {"device": s.device_hit_tokens, "cpu": 0, "disk": 0}
        tier_hits = connector_stats.get("hit_tokens_by_tier")
        if isinstance(tier_hits, dict):  # a connector of ours; another may report no tiers
            hits.update(tier_hits)
        return {
            "requests": self._num_requests,
            "prompt_tokens": self._prompt_tokens,
            "generated_tokens": self._generated_tokens,
            "prefill_tokens_computed": s.prefill_tokens_computed,
            "prefix_hit_tokens": hits,
            "prompt_hit_tokens": s.prompt_hit_tokens,
            "external_hit_tokens": s.external_hit_tokens,
            "preemptions": s.preemptions,
            "swapped_out_tokens": s.swapped_out_tokens,
            "recomputed_after_preemption": s.recomputed_after_preemption,
            "forks": self.kv_cache_manager.num_forks,
            "cow_copies": self.kv_cache_manager.num_cow_copies,
            "failed_loads": s.failed_loads,
            "failed_external_hit_tokens": s.failed_external_hit_tokens,
            "steps": s.steps,
            "device_cache_evictions": self.kv_cache_manager.block_pool.num_cache_evictions,
            "ttft_s": list(self._ttfts),
            "connector": connector_stats,
            "transfer": worker_stats,
        }

    def stats_record(self) -> EngineStats:
        """:meth:`stats` as a typed record whose fields say what each counter counts."""
        return EngineStats.from_dict(self.stats())

    def take_kv_events(self) -> list[Any]:
        """KV events (blocks stored into / removed from an offload tier) since the last call,
        oldest first, in vLLM's schema (``kvoffload.kv_events``: ``BlockStored`` with the
        engine's block hashes as 64-bit integers, parent and tokens; ``BlockRemoved``); needs
        ``metrics.events: true``. The queue is bounded: drain it regularly."""
        if self.scheduler_connector is None:
            return []
        return list(self.scheduler_connector.take_events())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.metrics_server is not None:
            self.metrics_server.close()
        self._close_connectors()

    def _close_connectors(self) -> None:
        for conn in (self.worker_connector, self.scheduler_connector):
            if conn is not None:
                conn.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
