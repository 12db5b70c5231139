"""The two manager contracts: vLLM's small one and the chain's; the reuse filter is a chain, not
a wrapper forwarding to one; the connector half reaches no manager attribute outside the
chain contract."""

import ast
import inspect
from pathlib import Path

import pytest

from kvoffload.offload import CPUOffloadingManager, FilterReusedOffloadingManager, OffloadingManager
from kvoffload.offload.chain import TierChain
from kvoffload.offload.host_tier_chain import HostTierChain, as_chain
from kvoffload.testing.memory_tier import MemoryTier

PROTOCOL = sorted(name for name, fn in inspect.getmembers(TierChain, inspect.isfunction)
                  if not name.startswith("_"))


def test_the_small_contract_is_vllms():
    """OffloadingManager keeps vLLM's operations; the chain's live in TierChain."""
    small = {name for name, _ in inspect.getmembers(OffloadingManager, inspect.isfunction) if not name.startswith("_")}
    assert small == {"lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store",
                     "take_events", "close"}


def test_the_reuse_filter_is_the_chain_with_stores_filtered():
    """Over a chain with a tier behind the host one, the filter is that chain (same tiers,
    demotions and all), overriding only what it filters."""
    cpu, behind = CPUOffloadingManager(2), MemoryTier(8)
    chain = FilterReusedOffloadingManager(HostTierChain(cpu, behind), 2)
    assert chain.primary is cpu and chain.secondaries == [behind]
    overrides = {name for name, v in vars(FilterReusedOffloadingManager).items()
                 if inspect.isfunction(v) and not name.startswith("_")}
    assert overrides == {"prepare_store", "on_store_miss", "report"}
    for hashes in ([1, 2], [1, 2], [3, 4]):
        out = chain.prepare_store(hashes)
        chain.complete_store(out.block_hashes_to_store)
    assert chain.prepare_store([3, 4]).block_hashes_evicted == [1, 2]  # second sighting: stored, 1 and 2 demoted
    (demotion,) = chain.take_demotions()
    assert demotion.block_hashes == [1, 2] and str(demotion.dst.medium()) == "REMOTE"
    assert chain.report().filter_skipped_blocks == 4 and chain.report().tiers[1].writing_blocks == 2


def test_a_manager_outside_the_chain_contract_is_refused_with_what_to_return():
    class Bare(OffloadingManager):
        def lookup(self, block_hashes):
            return 0

        def prepare_load(self, block_hashes):
            raise AssertionError

        def prepare_store(self, block_hashes):
            return None

    with pytest.raises(TypeError, match="Bare: the connector drives a TierChain; return a HostTierChain"):
        as_chain(Bare())


def test_the_connector_half_calls_only_protocol_methods_on_its_manager():
    source = Path(inspect.getfile(__import__("kvoffload.connector.scheduler.offloading_scheduler",
                                             fromlist=["x"]))).read_text()
    used = {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "manager"}
    assert used and used <= set(PROTOCOL), used - set(PROTOCOL)
    assert "getattr(self.manager" not in source
