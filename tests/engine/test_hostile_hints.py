"""Hints are client input on a shared server. On the bundled engine: no value in any field can
fail or wedge a step, tokens equal an unhinted run, the hinted policy's state stays within its
bound, and one tenant's hints never reach another tenant's sessions or take its blocks."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvoffload_policies.hinted import HintedCachePolicy

from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.offload import hints as hints_module
from kvoffload.offload.hints import HintError, RequestHint

PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)
#: 40 tokens: 5 blocks of 8. Tenant A's three prompts, then a fresh one per hostile request.
A_PROMPTS = [[200 + 7 * i + j for j in range(40)] for i in range(3)]


def _llm(**hints) -> LLM:
    # A 40-block host tier; a device cache of 63 usable blocks that a reset empties. Every hit is
    # loaded (on a busy machine the cost model may find recomputing 40 tokens faster, and these
    # tests count what the tier holds through what it serves).
    offload = {"tiers": [{"medium": "cpu", "capacity": "160KiB", "eviction_policy": "hinted"}], "hints": hints,
               "load_mode": "never-recompute"}
    return LLM(EngineConfig(block_size=8, num_gpu_blocks=64, kv_offload=offload))


def _serve(llm: LLM, rid: str, prompt: list[int], **kw) -> list[int]:
    llm.add_request(prompt, PARAMS, request_id=rid, **kw)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:  # a wedged engine never finishes it (or raises every step)
        if rid in llm.step():
            return list(llm.collect(rid).token_ids)
    raise AssertionError(f"request {rid} did not finish in 30 s")


def _reset_device(llm: LLM) -> None:
    """Empty the device prefix cache (its stores land first: a block a store reads is in use)."""
    connector = llm.scheduler_connector
    while connector is not None and connector.has_pending_work():
        llm.step()
    assert llm.reset_prefix_cache()


def _policy(llm: LLM) -> HintedCachePolicy:
    policy = llm.scheduler_connector.connector_scheduler.manager.primary.index.policy  # type: ignore[union-attr]
    assert isinstance(policy, HintedCachePolicy)
    return policy


def _last_session(policy: HintedCachePolicy) -> object:
    """The session the policy heard of last."""
    return max(policy.sessions.values(), key=lambda s: s.last).name


def _tier_hits(llm: LLM) -> int:
    return llm.stats()["connector"]["hit_tokens_by_tier"].get("cpu", 0)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(hints_module, "_warned", set())


HOSTILE = [
    {"expect_return_s": 10**400},
    {"lease_s": 10**400},
    {"session": 10**5000},
    {"session": "x" * (1 << 20)},
    {"session": {"nested": [{"deep": [1, 2, 3]}]}},
    {"expect_return_s": 1e308, "lease_s": float("inf")},
    {"expect_return_s": float("nan"), "priority": 10**9},
    {"priority": -(10**30), "lease_s": -1},
    {f"field-{i}": i for i in range(1000)},
    [[[[[]]]]],
    "chat-0",
]


@pytest.mark.parametrize("hint", HOSTILE, ids=range(len(HOSTILE)))
def test_no_hint_value_fails_or_wedges_a_step(hint):
    """One request used to wedge the engine: ``math.isfinite(10**400)`` raised inside
    ``schedule()``, halfway through a step, and every later step raised ``KeyError``."""
    with _llm() as llm:
        want = [_serve(llm, f"plain-{i}", p) for i, p in enumerate(A_PROMPTS)]
    with _llm() as llm:
        got = _serve(llm, "hostile", A_PROMPTS[0], hint=hint)
        after = [_serve(llm, f"after-{i}", p) for i, p in enumerate(A_PROMPTS)]
        policy = _policy(llm)
    assert [got, *after[1:]] == want and after[0] == want[0]
    assert len(policy.sessions) <= 2 and policy.shares.leased_blocks == 0 and policy.shares.raised_blocks == 0


def test_a_warning_per_kind_of_fault_not_per_value(caplog):
    """A client sending a thousand invented field names (or session values) gets one warning
    line per kind of fault; the set of warnings given stays bounded."""
    with _llm() as llm, caplog.at_level("WARNING", logger="kvoffload"):
        for i in range(20):
            _serve(llm, f"r{i}", A_PROMPTS[i % 3], hint={f"f{i}": 1, "session": ["list", i], "lease_s": -i})
    lines = [r.getMessage() for r in caplog.records if r.name == "kvoffload"]
    assert len(lines) == 3 and len(hints_module._warned) == 3
    assert any("'f0' is unknown" in line for line in lines)
    assert any("session=<a list of 2 items>" in line for line in lines)


@pytest.mark.parametrize("fields, named", [
    ({"expect_return_s": math.nan}, "expect_return_s=nan"),
    ({"expect_return_s": math.inf}, "expect_return_s=inf"),
    ({"lease_s": 10**400}, "lease_s=<an integer of 1329 bits>"),
    ({"priority": 10**9}, "priority=1000000000"),
    ({"priority": 1.0}, "priority=1.0"),
    ({"session": ""}, "session=''"),
    ({"session": 17}, "session=17"),
    ({"session": "s" * 300}, "(300 characters)"),
])
def test_a_request_hint_built_directly_is_validated(fields, named):
    with pytest.raises(HintError, match=None) as info:
        RequestHint(**fields)
    assert named in str(info.value) and "give" in str(info.value)


def test_another_tenants_hints_never_reach_a_tenants_sessions():
    """Tenant B (another cache_salt, so it can never read A's KV) sends hints naming A's
    sessions with a day's lease and a return in a day: they used to overwrite A's sessions'
    priority, lease and return, and move A's blocks to the dead list (A's hits fell to 54%)."""
    with _llm() as llm:
        for i, p in enumerate(A_PROMPTS):
            _serve(llm, f"a-{i}", p, cache_salt="A", hint={"session": f"chat-{i}", "expect_return_s": 0})
        policy = _policy(llm)
        a_sessions = {k: (s.expect, s.priority, s.lease_until, s.blocks, list(s.chain)) for k, s in
                      policy.sessions.items()}
        b_sessions = set()
        for i in range(6):  # 30 more blocks: the 40-block tier must evict
            _serve(llm, f"b-{i}", [9, 9, i] + A_PROMPTS[i % 3][3:], cache_salt="B",
                   hint={"session": f"chat-{i % 3}", "expect_return_s": 86400, "lease_s": 86400})
            b_sessions.add(_last_session(policy))
            assert {k: (s.expect, s.priority, s.lease_until, s.blocks, list(s.chain)) for k, s in
                    policy.sessions.items() if k in a_sessions} == a_sessions
        assert len(b_sessions) == 3 and b_sessions.isdisjoint(a_sessions)
        assert all(not policy.sessions[k].dead for k in a_sessions)
        _reset_device(llm)
        before = _tier_hits(llm)
        for i, p in enumerate(A_PROMPTS):
            _serve(llm, f"a-again-{i}", p, cache_salt="A", hint={"session": f"chat-{i}", "expect_return_s": 0})
        assert _tier_hits(llm) - before == 3 * 40  # every block of A's prompts from the host tier


def test_tenants_are_the_salt_the_adapter_and_the_operators_keys():
    """HintRelay's tenant: the request's cache_salt, its adapter's digest (LoRA) and the
    ``kv_transfer_params`` entries named in ``hints.tenant_keys`` (set by a trusted gateway)."""
    from types import SimpleNamespace

    from kvoffload.config import HintsConfig
    from kvoffload.connector.scheduler.hint_relay import HintRelay
    from kvoffload.connector.scheduler.request_state import RequestOffloadState
    from kvoffload.connector.scheduler.scheduler_stats import SchedulerSideStats

    given: list = []
    chain = SimpleNamespace(hint=lambda keys, hint: given.append(hint.session))
    relay = HintRelay(chain, HintsConfig(tenant_keys=("tenant",)), SchedulerSideStats(),  # type: ignore[arg-type]
                      request_salt=lambda r: b"lora-" + r.lora if r.lora else None)

    def session(rid, salt=None, lora=b"", **params):
        request = SimpleNamespace(request_id=rid, cache_salt=salt, lora=lora, output_token_ids=[],
                                  kv_transfer_params={"kvoffload": {"session": "chat"}, **params})
        state = RequestOffloadState()
        relay.looked_up(request, state, [[rid]])
        relay.finished(request, state, lambda: [])
        return given[-1]

    base = session("a")
    assert base[1] == "chat" and session("b") == base
    others = [session("c", salt="s"), session("d", lora=b"x"), session("e", tenant="t1"), session("f", tenant="t2"),
              session("g", tenant=10**5000), session("h", tenant={"nested": [1]})]
    assert len({base, *others}) == 1 + len(others)  # each a tenant of its own
    assert session("i", tenant="t1") == others[2]


def test_hostile_hints_do_not_change_what_kv_events_announce():
    """The same requests under eviction pressure, unhinted and with a hostile hint on each (every
    field out of bounds, another tenant's session names): the tiers announce the same blocks
    stored and removed, in the same order."""
    def events(hinted: bool) -> list:
        offload = {"tiers": [{"medium": "cpu", "capacity": "64KiB", "eviction_policy": "hinted"}],
                   "metrics": {"events": True}}
        out = []
        with LLM(EngineConfig(block_size=8, num_gpu_blocks=64, kv_offload=offload)) as llm:
            connector = llm.scheduler_connector
            for i in range(12):  # 16 host blocks; 5 a request: evictions from the fourth on
                hint = HOSTILE[i % len(HOSTILE)] if hinted else None
                _serve(llm, f"r{i}", [(i * 11 + j) % 250 + 1 for j in range(40)], hint=hint)
                while connector is not None and connector.has_pending_work():  # its stores land first
                    llm.step()
                out += llm.take_kv_events()
        # One entry per block: how the events batch them depends on when a step looks.
        return [(type(e).__name__, h, e.medium) for e in out for h in e.block_hashes]

    plain = events(False)
    assert sum(kind == "BlockRemoved" for kind, *_ in plain) > 0
    assert events(True) == plain


# ---- hostile JSON at every field (Hypothesis) ------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                     max_size=4), max_leaves=12)
HOSTILE_FIELD = (JSON | st.integers(min_value=-(10**600), max_value=10**600) | st.text(min_size=200, max_size=2000)
                 | st.floats(min_value=-1e9, max_value=1e9))
HINTS = st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "session": HOSTILE_FIELD | st.sampled_from(["chat-0", "chat-1", "chat-2"]),
    "expect_return_s": HOSTILE_FIELD, "priority": HOSTILE_FIELD, "lease_s": HOSTILE_FIELD,
    "extra": JSON}))


class _Run:
    """One engine for all examples (state carries over: more hostile, and fast); A's prompts'
    unhinted tokens; B's next fresh prompt."""

    def __init__(self) -> None:
        self.llm = _llm()
        self.want = {}
        with _llm() as plain:
            self.want = {i: _serve(plain, f"w{i}", p) for i, p in enumerate(A_PROMPTS)}
            self.b_want = [_serve(plain, f"b{i}", self.b_prompt(i)) for i in range(400)]
        self.n = 0

    @staticmethod
    def b_prompt(i: int) -> list[int]:
        return [(i * 13 + j * 5) % 180 + 1 for j in range(40)]


_RUN: list[_Run] = []


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(HINTS, min_size=1, max_size=5))
def test_hostile_hints_through_the_bundled_engine(flood):
    """Tenant A (salt A) returns to its three sessions right away (hinted as due back at once);
    tenant B (salt B) sends fresh prompts with arbitrary JSON in every hint field, between A's
    rounds. The engine keeps serving, B's tokens equal unhinted ones, the policy's tracked state
    stays within ``max_sessions()``, and A's next round finds at least 90% of its blocks in the
    host tier (B's only hold on the tier is leases within their 25% share: A's 15 blocks fit)."""
    if not _RUN:
        _RUN.append(_Run())
    run = _RUN[0]
    llm = run.llm
    for i, p in enumerate(A_PROMPTS):
        assert _serve(llm, f"a{run.n}-{i}", p, cache_salt="A", hint={"session": f"chat-{i}",
                                                                    "expect_return_s": 0}) == run.want[i]
    for hint in flood:
        k = run.n % len(run.b_want)
        run.n += 1
        assert _serve(llm, f"b{run.n}", run.b_prompt(k), cache_salt="B", hint=hint) == run.b_want[k]
    _reset_device(llm)
    before = _tier_hits(llm)
    for i, p in enumerate(A_PROMPTS):
        assert _serve(llm, f"a{run.n}-again-{i}", p, cache_salt="A",
                      hint={"session": f"chat-{i}", "expect_return_s": 0}) == run.want[i]
    assert _tier_hits(llm) - before >= 0.9 * 3 * 32
    policy = _policy(llm)
    assert len(policy.sessions) <= policy.max_sessions() and len(policy.pending) <= policy.pending_cap
    assert 0 <= policy.shares.leased_blocks <= policy.cache_capacity and policy.shares.raised_blocks >= 0
