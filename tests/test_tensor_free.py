"""The scheduler half imports no torch: in vLLM it runs in the engine-core process, and a missing
or broken torch must never look like something else there (it used to surface as "native
ledger not built", through ``kvoffload_ext``'s eager import of the copy kernels)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: Everything the scheduler process loads: the ledger, the tiers' scheduler halves, the chain,
#: the connector's scheduler half and the spec that builds it (whose handlers load lazily).
SCRIPT = textwrap.dedent("""
    import importlib, pkgutil, sys
    sys.modules["torch"] = None  # any `import torch` now raises ImportError

    import kvoffload.connector, kvoffload.offload, kvoffload.tiers
    names = ["kvoffload.config", "kvoffload_ext", "kvoffload_ext.ledger", "kvoffload.connector.offloading_connector"]
    for pkg in (kvoffload.offload, kvoffload.connector, kvoffload.tiers):
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    for name in names:
        if not name.startswith("kvoffload.connector.worker"):  # the worker half may use torch
            importlib.import_module(name)

    from kvoffload.connector import KVConnectorRole, OffloadingConnector
    from kvoffload.kv_info import EngineKVInfo
    from kvoffload.offload.native_ledger import native_available

    assert native_available(), "the native ledger must load without torch"
    cfg = {"tiers": [{"medium": "cpu", "capacity": 6400, "eviction_policy": "arc"},
                     {"medium": "disk", "path": sys.argv[1], "capacity": 12800}]}
    conn = OffloadingConnector(cfg, KVConnectorRole.SCHEDULER,
                               kv_info=EngineKVInfo(block_size=4, block_bytes=100, num_device_blocks=16))
    manager = conn.connector_scheduler.manager
    out = manager.prepare_store([1, 2, 3])
    manager.complete_store([1, 2, 3])
    assert manager.lookup([1, 2, 3, 4]) == 3
    print(len(names), "modules")
""")


def test_the_scheduler_half_runs_with_torch_unimportable(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "disk")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[0]) > 50


def test_the_copy_kernels_still_come_from_the_package_root():
    import kvoffload_ext
    from kvoffload_ext.copies import copy_block_groups, copy_blocks

    assert kvoffload_ext.copy_blocks is copy_blocks
    assert kvoffload_ext.copy_block_groups is copy_block_groups
