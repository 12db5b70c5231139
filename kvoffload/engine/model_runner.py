"""ModelRunner: persistent per-request rows, block tables, slot mapping, forward and sampling.

The KV cache is allocated once here and never resized. A connector's worker half, when
present, receives the cache tensors at start-up and is driven around each forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvoffload.connector.base import KVConnectorBase, KVConnectorOutput
from kvoffload.engine.kv_groups import kv_cache_layout
from kvoffload.engine.layers import LayerHook
from kvoffload.engine.model_config import ModelConfig
from kvoffload.engine.model_loader import build_model
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.engine.paged_attention import AttentionMetadata
from kvoffload.engine.sampler import sample_token
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.scheduler_output import SchedulerOutput


@dataclass(slots=True)
class CachedRequestState:
    req_id: str
    token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    sampling_params: SamplingParams
    seed: int
    num_prompt_tokens: int


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        connector: KVConnectorBase | None = None,
        record_logits: bool = False,
    ) -> None:
        self.model_config = model_config
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        self.model = build_model(model_config, seed, dtype, self.device)
        self.layout = kv_cache_layout(model_config)
        shape = (2, num_blocks, block_size, model_config.num_key_value_heads, model_config.head_dim)
        #: One tensor per slot of a KV-cache group, shared by the groups (each block id belongs
        #: to one group); layer i reads and writes tensor layout.placement[i][1].
        self.kv_caches = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(self.layout.num_tensors)]
        self.layer_kv = [self.kv_caches[j] for _, j in self.layout.placement]
        self.layer_names = [f"model.layers.{i}.self_attn" for i in range(model_config.num_hidden_layers)]
        self.requests: dict[str, CachedRequestState] = {}
        self.connector = connector
        self.record_logits = record_logits
        if connector is not None:
            if self.layout.is_hybrid:  # shared tensors: each once, by the tensor's slot
                connector.register_kv_caches({f"kv_cache.{j}": kv for j, kv in enumerate(self.kv_caches)})
            else:
                connector.register_kv_caches(dict(zip(self.layer_names, self.kv_caches)))

    def _update_states(self, so: SchedulerOutput) -> None:
        # Preempted rows stay: a resumed request arrives with a full token and block replacement.
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState(
                req_id=new.req_id,
                token_ids=list(new.prompt_token_ids),
                block_ids=tuple(list(g) for g in new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                sampling_params=new.sampling_params,
                seed=new.seed,
                num_prompt_tokens=new.num_prompt_tokens if new.num_prompt_tokens >= 0 else len(new.prompt_token_ids),
            )
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            state = self.requests[rid]
            new_ids = cached.new_block_ids[i]
            if cached.resumed_from_preemption[i]:
                token_ids = cached.resumed_token_ids[i]
                assert token_ids is not None and new_ids is not None
                state.token_ids = list(token_ids)
                state.block_ids = tuple(list(g) for g in new_ids)
            elif new_ids is not None:
                for group, ids in zip(state.block_ids, new_ids):
                    group.extend(ids)
            if cached.new_token_ids and cached.new_token_ids[i]:
                state.token_ids.extend(cached.new_token_ids[i])
            state.num_computed_tokens = cached.num_computed_tokens[i]
        for rid, replacements in so.block_replacements.items():
            replaced = self.requests.get(rid)
            if replaced is not None:
                for gid, idx, block_id in replacements:
                    replaced.block_ids[gid][idx] = block_id

    def _prepare_inputs(
        self, so: SchedulerOutput, order: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor, list[AttentionMetadata]]:
        """Tokens and positions of this step, and each layer's attention metadata (one per
        KV-cache group: its block tables and slot mapping)."""
        tokens: list[int] = []
        positions: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        for rid in order:
            state = self.requests[rid]
            n = so.num_scheduled_tokens[rid]
            start = state.num_computed_tokens
            tokens += state.token_ids[start : start + n]
            positions += range(start, start + n)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
        bs = self.block_size
        metas = []
        for g in range(len(self.layout.groups)):
            slots: list[int] = []
            tables = [self.requests[rid].block_ids[g] for rid in order]
            for table, begin, end in zip(tables, qsl, qsl[1:]):
                slots += [table[p // bs] * bs + p % bs for p in positions[begin:end]]
            width = max((len(t) for t in tables), default=0)
            block_tables = torch.zeros((len(tables), width), dtype=torch.int64)
            for r, table in enumerate(tables):
                block_tables[r, : len(table)] = torch.tensor(table, dtype=torch.int64)
            metas.append(AttentionMetadata(
                slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
                query_start_loc=qsl,
                seq_lens=seq_lens,
                block_tables=block_tables.to(self.device),
                block_size=bs,
            ))
        return (
            torch.tensor(tokens, dtype=torch.int64, device=self.device),
            torch.tensor(positions, dtype=torch.int64, device=self.device),
            [metas[g] for g, _ in self.layout.placement],
        )

    def _layer_hooks(self) -> tuple[LayerHook | None, LayerHook | None]:
        """Per-layer connector calls around attention (layer-wise load waits and saves)."""
        connector = self.connector
        if connector is None:
            return None, None
        names = self.layer_names
        return (lambda i, _kv: connector.wait_for_layer_load(names[i]),
                lambda i, kv: connector.save_kv_layer(names[i], kv))

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(so)
        connector = self.connector
        if connector is not None:
            meta_obj = so.kv_connector_metadata
            connector.bind_connector_metadata(meta_obj)
            connector.handle_preemptions(meta_obj)
            connector.start_load_kv()
        if so.blocks_to_copy:  # copy-on-write: private copies before anything writes into them
            src = torch.tensor([a for a, _ in so.blocks_to_copy], device=self.device)
            dst = torch.tensor([b for _, b in so.blocks_to_copy], device=self.device)
            for kv in self.kv_caches:
                kv[:, dst] = kv[:, src]
        order = [r.req_id for r in so.scheduled_new_reqs] + list(so.scheduled_cached_reqs.req_ids)
        order = [rid for rid in order if so.num_scheduled_tokens.get(rid, 0) > 0]
        sampled: list[list[int]] = []
        logits_out: dict[str, torch.Tensor] = {}
        candidates: dict[str, list[tuple[int, float]]] = {}
        hidden = None
        last_rows: list[int] = []
        if order:
            input_ids, positions, metas = self._prepare_inputs(so, order)
            hidden = self.model(input_ids, positions, self.layer_kv, metas, *self._layer_hooks())
            last_rows = [metas[0].query_start_loc[r + 1] - 1 for r in range(len(order))]
        kv_output, rolled_back = self._finish_kv_step(so, order)
        if hidden is not None:
            logits = self.model.compute_logits(hidden[last_rows])
            for r, rid in enumerate(order):
                state = self.requests[rid]
                if rid in rolled_back:
                    state.num_computed_tokens = rolled_back[rid]
                    sampled.append([])
                    continue
                state.num_computed_tokens += so.num_scheduled_tokens[rid]
                if state.num_computed_tokens < len(state.token_ids):
                    sampled.append([])
                    continue
                output_index = len(state.token_ids) - state.num_prompt_tokens
                params = state.sampling_params
                if params.beam_width:
                    # Beam search: the scheduler side picks the token; report the candidates.
                    logprobs = torch.log_softmax(logits[r].float(), dim=-1)
                    top = torch.topk(logprobs, min(2 * params.beam_width, logprobs.numel()))
                    candidates[rid] = list(zip(top.indices.tolist(), top.values.tolist()))
                    sampled.append([])
                    continue
                num = params.n if output_index == 0 else 1
                tokens = [sample_token(logits[r], params, state.seed + i, output_index) for i in range(num)]
                state.token_ids.append(tokens[0])
                sampled.append(tokens)
                if self.record_logits:
                    logits_out[rid] = logits[r].clone()
        return ModelRunnerOutput(req_ids=order, sampled_token_ids=sampled, logits=logits_out,
                                 kv_connector_output=kv_output, beam_candidates=candidates, rolled_back=rolled_back)

    def _finish_kv_step(self, so: SchedulerOutput, order: list[str]) -> tuple[KVConnectorOutput | None, dict[str, int]]:
        """The connector's end of the step (saves, finished copies), and the requests that read
        a block a synchronous load failed to fill: each keeps the KV before its first such
        block and recomputes the rest (as vLLM does with get_block_ids_with_load_errors)."""
        connector = self.connector
        if connector is None:
            return None, {}
        connector.wait_for_save()
        sent, recved = connector.get_finished(so.finished_req_ids)
        invalid = connector.get_block_ids_with_load_errors()
        kv_output = KVConnectorOutput(
            finished_sending=set(sent or ()),
            finished_recving=set(recved or ()),
            failed_recving=connector.get_failed_recving(),
            worker_meta=connector.build_connector_worker_meta(),
        )
        connector.clear_connector_metadata()
        rolled_back: dict[str, int] = {}
        for rid in order if invalid else ():
            state = self.requests[rid]
            bad = [i for group in state.block_ids for i, b in enumerate(group) if b in invalid]
            if bad:
                rolled_back[rid] = min(state.num_computed_tokens, min(bad) * self.block_size)
        return kv_output, rolled_back
