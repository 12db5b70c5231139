"""The tier example of docs/write-a-tier.md (examples/zram_tier) works as a user's own package:
installed beside kvoffload (its entry point is its one registration line), it is configured
by its medium name, serves hits the host tier no longer holds with the same tokens as no
offload, and `kvoffload plan` sizes it — without a line of kvoffload changed for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "zram_tier"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The example pip-installed into a directory of its own: the environment a process that
    sees it runs with."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(EXAMPLE)], check=True, capture_output=True, timeout=300)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO)])}


def _python(env: dict[str, str], script: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_example_is_served_from_and_gives_the_same_tokens(installed):
    out = _python(installed, """
        import json
        from kvoffload.engine import LLM, EngineConfig
        from kvoffload.registry import TIER_KINDS
        from kvoffload.workload import ChatWorkload, run_chat_workload

        work = ChatWorkload(conversations=12, turns=3, system_tokens=128, user_tokens=64, max_tokens=8)

        def run(kv_offload):
            cfg = EngineConfig(num_gpu_blocks=60, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=kv_offload)
            with LLM(cfg) as llm:
                return run_chat_workload(llm, work), llm.stats()

        # A host tier of 24 blocks (8 KiB each) in front of the example: most returning turns
        # find their prefix evicted to zram.
        chain = {"tiers": [{"medium": "cpu", "capacity": 24 * 8192},
                           {"medium": "zram", "capacity": "4MiB", "load_mode": "never-recompute"}]}
        plain, _ = run(None)
        tokens, stats = run(chain)
        print(json.dumps({"known": "zram" in TIER_KINDS.known(), "same": tokens == plain,
                          "hits": stats["connector"]["hit_tokens_by_tier"],
                          "demoted": stats["connector"]["demoted_blocks"],
                          "usage": stats["connector"]["tier_usage"]}))
    """)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["known"] and got["same"]
    assert got["demoted"] > 0 and got["hits"].get("zram", 0) > 0, got
    assert got["usage"]["zram"][0] > 0 and got["usage"]["zram"][1] == 4 * 2**20 // 8192


def test_kvoffload_plan_sizes_the_example(installed, tmp_path):
    profile = yaml.safe_load((REPO / "kvoffload" / "examples" / "plan" / "profile.yaml").read_text())
    profile["tiers"]["zram"] = dict(profile["tiers"]["cpu"])  # measured speeds of the user's tier, added by hand
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    out = subprocess.run([sys.executable, "-m", "kvoffload", "plan", "--model", "tiny",
                          "--log", str(REPO / "kvoffload" / "examples" / "plan" / "sample.jsonl"),
                          "--tiers", "cpu:64KiB+zram:{1,4}MiB", "--profile", str(tmp_path / "profile.yaml"),
                          "--json", str(tmp_path / "plan.json")],
                         env=installed, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "zram:4MiB" in out.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert "zram" in json.dumps(plan)


def test_without_the_package_the_medium_is_refused_by_name(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "kvoffload", "plan", "--model", "tiny",
                          "--log", str(REPO / "kvoffload" / "examples" / "plan" / "sample.jsonl"),
                          "--tiers", "cpu:64KiB+zram:1MiB"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "zram" in out.stderr and len(out.stderr.strip().splitlines()) <= 3, out.stderr
