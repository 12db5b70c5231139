"""A prefix lookup from the connector reaches the C ledger in at most four Python frames:
connector facade → scheduler half → load planner → chain, which reads the host tier's slot
table (the C ledger's own methods) directly. It once took seven, the same interface repeated by
the chain, the tier and the slot table, and each frame cost a tenth of the ledger's time."""

import sys
from types import FrameType

import pytest

from kvoffload.connector import KVConnectorRole, OffloadingConnector
from kvoffload.offload.native_ledger import native_available
from kvoffload.offload.spec import EngineKVInfo
from tests.connector.test_lookup_calls import Request

pytestmark = pytest.mark.skipif(not native_available(), reason="the native ledger is not built here")


def _frames_at_c_call(run, c_method) -> list[list[str]]:
    """For each call of the C method ``c_method`` made by ``run()``, the Python frames on the
    stack up to the connector's entry point, innermost last."""
    stacks: list[list[str]] = []
    entry = OffloadingConnector.get_num_new_matched_tokens.__code__

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "c_call" and arg == c_method:
            names, f = [], frame
            while f is not None and f.f_code is not entry:
                names.append(f.f_code.co_qualname)
                f = f.f_back
            if f is not None:
                names.append(f.f_code.co_qualname)  # the facade's frame, the first of the path
                stacks.append(names[::-1])

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return stacks


@pytest.mark.parametrize("tiers", [["cpu"], ["cpu", "disk"]])
def test_a_lookup_reaches_the_c_ledger_in_four_python_frames(tmp_path, tiers):
    cfg = {"tiers": [{"medium": "cpu", "capacity": 16 * 100}]}
    if "disk" in tiers:
        cfg["tiers"].append({"medium": "disk", "capacity": 4096 + 16 * 164, "path": str(tmp_path)})
    info = EngineKVInfo(block_size=4, block_bytes=100, num_device_blocks=32)
    connector = OffloadingConnector(cfg, KVConnectorRole.SCHEDULER, kv_info=info)
    chain = connector.connector_scheduler.manager
    chain.prepare_store([11, 12])
    chain.complete_store([11, 12])
    core = chain.primary.index._core
    stacks = _frames_at_c_call(lambda: connector.get_num_new_matched_tokens(Request("r", [11, 12, 13]), 0),
                               core.lookup)
    assert stacks, "the lookup never reached the C ledger"
    assert all(len(s) <= 4 for s in stacks), stacks
    assert stacks == [["OffloadingConnector.get_num_new_matched_tokens",
                       "OffloadingConnectorScheduler.get_num_new_matched_tokens", "LoadPlanner.hit_tokens",
                       "HostTierChain.lookup_prefix"]]
