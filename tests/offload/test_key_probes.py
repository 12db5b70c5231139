"""``key_probes``: the cheapest one-key checks a chain hands vLLM's adapter, answering as the
chain's own ``is_ready`` / ``is_pending`` do."""

from __future__ import annotations

import pytest

from kvoffload.offload.cpu_tier import CPUTier
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.offload.native_ledger import native_available
from kvoffload.testing.memory_tier import MemoryTier

KEYS = [b"ready", b"pending", b"absent"]


def filled(chain: HostTierChain) -> HostTierChain:
    out = chain.prepare_store([b"ready", b"pending"])
    assert out is not None
    chain.complete_store([b"ready"])  # b"pending" stays written, not ready
    return chain


def answers(probes) -> list[tuple[bool, bool]]:
    is_ready, is_pending = probes
    return [(is_ready(k), is_pending(k)) for k in KEYS]


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=pytest.mark.skipif(
    not native_available(), reason="the native ledger is not built"))])
def test_a_host_tier_alone_hands_out_its_slot_tables_own_checks(native):
    chain = filled(HostTierChain(CPUTier(8, "lru", native=native)))
    probes = chain.key_probes()
    assert answers(probes) == [(True, False), (False, True), (False, False)]
    assert answers(probes) == answers((chain.is_ready, chain.is_pending))
    owner = probes[0].__self__
    assert owner is not chain and owner is not chain.primary  # no chain or tier frame in between


def test_a_chain_with_a_slower_tier_answers_through_the_chain():
    chain = filled(HostTierChain(CPUTier(8, "lru"), MemoryTier(8)))
    probes = chain.key_probes()
    assert probes[0].__self__ is chain and probes[1].__self__ is chain
    assert answers(probes) == [(True, False), (False, True), (False, False)]


def test_a_subclass_that_answers_itself_keeps_its_answer():
    class Hiding(HostTierChain):
        def is_ready(self, block_hash):  # e.g. a chain that hides some keys
            return block_hash != b"ready" and super().is_ready(block_hash)

    chain = filled(Hiding(CPUTier(8, "lru")))
    assert answers(chain.key_probes())[0] == (False, False)
