"""Every method of the TierChain contract reaches the backing chain through each decorator, and
the connector half reaches no manager attribute outside that contract."""

import ast
import inspect
from pathlib import Path
from unittest import mock

import pytest
from kvoffload_policies.simulator import OpRecorder

from kvoffload.offload import FilterReusedOffloadingManager, OffloadingManager
from kvoffload.offload.chain import TierChain
from kvoffload.offload.forwarding import ForwardingTierChain
from kvoffload.offload.tiered_manager import TieredOffloadingManager

PROTOCOL = sorted(name for name, fn in inspect.getmembers(TierChain, inspect.isfunction)
                  if not name.startswith("_"))
ARGS = {"is_pending": (1,), "is_ready": (1,), "drop_corrupt": ("DISK", [0]), "record_io": ("DISK", False, True),
        "complete_demotion": ([1], True, "DISK"), "complete_load": ([1], "CPU"), "complete_store": ([1], True)}


def _call(manager, name):
    args = ARGS.get(name, () if name in ("take_events", "close", "take_demotions", "has_pending_demotions", "report")
                    else ([1],))
    return getattr(manager, name)(*args)


def test_the_small_contract_is_vllms():
    """OffloadingManager keeps vLLM's operations; the chain's live in TierChain."""
    small = {name for name, _ in inspect.getmembers(OffloadingManager, inspect.isfunction) if not name.startswith("_")}
    assert small == {"lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store",
                     "take_events", "close"}


@pytest.mark.parametrize("decorator", [ForwardingTierChain, OpRecorder,
                                       lambda b: FilterReusedOffloadingManager(b, 2)],
                         ids=["forwarding", "recorder", "reuse-filter"])
@pytest.mark.parametrize("name", PROTOCOL)
def test_each_protocol_method_reaches_the_backing_manager(decorator, name):
    backing = mock.create_autospec(TieredOffloadingManager, instance=True)
    backing.prepare_load_segments.return_value = []
    backing.prepare_store.return_value = None
    backing.lookup.return_value = 1
    wrapped = decorator(backing)
    _call(wrapped, name)
    if name == "prepare_load_segments" and isinstance(wrapped, OpRecorder):
        name = "prepare_load"  # the recorder loads through its own (recorded) prepare_load
    if name == "lookup_prefix" and isinstance(wrapped, OpRecorder):
        name = "lookup"  # ... and looks up through its own (recorded) lookup
    if name == "prepare_store" and isinstance(wrapped, FilterReusedOffloadingManager):
        backing.prepare_store.assert_called_once_with([])  # filtered: the first sighting admits nothing
        return
    assert getattr(backing, name).called, f"{type(wrapped).__name__}.{name} did not reach the backing manager"


def test_the_connector_half_calls_only_protocol_methods_on_its_manager():
    source = Path(inspect.getfile(__import__("kvoffload.connector.offloading_scheduler",
                                             fromlist=["x"]))).read_text()
    used = {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "manager"}
    assert used and used <= set(PROTOCOL), used - set(PROTOCOL)
    assert "getattr(self.manager" not in source
