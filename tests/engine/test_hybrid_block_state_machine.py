"""Hypothesis state machine over a hybrid model's device blocks (one full-attention group, two
sliding-window groups, one pool): admissions with prefix hits, chunked prefill and decode, forks
and frees in any order. Invariants after every step: each block's reference count is exactly the
number of request tables holding it, free + held = the pool, the null block only ever fills a
sliding group's leading positions (and never a full group's), a running request's sliding
groups hold no more than one window and one chunk, and a prefix hit's window is real."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.request import Request
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.single_type_manager import SlidingWindowManager, cdiv

BS, WINDOW, CHUNK, POOL = 4, 10, 8, 80
PREFIXES = [[p * 100 + i for i in range(40)] for p in range(3)]


class HybridBlocks(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kvm = KVCacheManager(POOL, BS, 4096, windows=(None, WINDOW, WINDOW))
        self.requests: dict[str, Request] = {}
        self.n = 0

    @rule(prefix=st.integers(0, 2), cut=st.integers(1, 40), tail=st.integers(0, 12))
    def admit(self, prefix, cut, tail):
        self.n += 1
        tokens = PREFIXES[prefix][:cut] + [10_000 + self.n * 50 + i for i in range(tail)]
        req = Request(f"r{self.n}", tokens, SamplingParams(max_tokens=4), block_size=BS)
        hit_blocks, hit = self.kvm.get_computed_blocks(req)
        if hit:  # the hit's window is real in every sliding group, its prefix in the full one
            full, *sliding = hit_blocks.blocks
            assert len(full) * BS == hit and not any(b.is_null for b in full)
            for group in sliding:
                need = min(cdiv(WINDOW - 1, BS), len(group))
                assert not any(b.is_null for b in group[len(group) - need:])
        num_new = min(CHUNK, req.num_tokens - hit)
        if self.kvm.allocate_slots(req, num_new, hit, hit_blocks) is None:
            return
        req.num_computed_tokens = hit + num_new
        self.kvm.cache_blocks(req, req.num_computed_tokens)
        self.requests[req.request_id] = req

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def advance(self, data):
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        req = self.requests[rid]
        left = req.num_tokens - req.num_computed_tokens
        if left == 0:  # decode: one more token
            req.append_output_token_ids(7)
            left = 1
        num_new = min(CHUNK, left)
        if self.kvm.allocate_slots(req, num_new) is None:
            return
        req.num_computed_tokens += num_new
        self.kvm.cache_blocks(req, req.num_computed_tokens)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def fork(self, data):
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        parent = self.requests[rid]
        self.n += 1
        child = Request(f"r{self.n}", list(parent.prompt_token_ids), parent.sampling_params, block_size=BS)
        child.output_token_ids = list(parent.output_token_ids)
        child.all_token_ids = list(parent.all_token_ids)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        self.kvm.fork(parent, child)
        self.requests[child.request_id] = child

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        self.kvm.free(self.requests.pop(rid))

    @invariant()
    def blocks_are_accounted_for(self):
        pool = self.kvm.block_pool
        holders: dict[int, int] = {}
        for rid in self.requests:
            for g, group in enumerate(self.kvm.get_blocks(rid).blocks):
                nulls = [b.is_null for b in group]
                if g == 0:
                    assert not any(nulls), f"{rid}: the null block in a full-attention table"
                else:
                    first_real = nulls.index(False) if False in nulls else len(nulls)
                    assert not any(nulls[first_real:]), f"{rid}: the null block right of a real one in group {g}"
                for b in group:
                    if not b.is_null:
                        holders[b.block_id] = holders.get(b.block_id, 0) + 1
        for block in pool.blocks[1:]:
            assert block.ref_cnt == holders.get(block.block_id, 0), block
        assert pool.get_num_free_blocks() + len(holders) == POOL - 1

    @invariant()
    def sliding_groups_hold_one_window(self):
        for rid, req in self.requests.items():
            for manager in self.kvm.coordinator.managers:
                if isinstance(manager, SlidingWindowManager):
                    real = sum(1 for b in manager.req_to_blocks.get(rid, ()) if not b.is_null)
                    # The window before the last computed token, and the chunk just allocated.
                    assert real <= cdiv(WINDOW - 1, BS) + cdiv(CHUNK, BS) + 2, (rid, real)


HybridBlocks.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestHybridBlocks = HybridBlocks.TestCase
