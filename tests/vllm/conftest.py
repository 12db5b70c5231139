"""The tiny random Llama every real-vLLM test serves, made locally (nothing is downloaded)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("vllm_job.py")


@pytest.fixture(scope="session", autouse=True)
def plain_runs(tmp_path_factory):
    """One directory per test session, shared by its xdist workers, for plain vLLM's outputs
    (``run_job`` runs each plain job once a session)."""
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    os.environ["KVOFFLOAD_TEST_PLAIN_RUNS"] = str(shared / "plain-vllm-runs")
    yield
    os.environ.pop("KVOFFLOAD_TEST_PLAIN_RUNS", None)


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(JOB.parent)!r}); "
                    f"import vllm_job; vllm_job.make_model({str(path)!r})"], check=True)
    return str(path)


#: The longest tests (CI's ``--durations``, 70-240 s each), started first: two workers then end
#: together instead of one running the chaos test alone at the end.
LONGEST = ("test_http_chaos_keeps_vllm_up_and_correct", "test_tensor_parallel_ranks_write_and_read_their_own_shards",
           "test_bench_serve_chat_runs_end_to_end", "test_second_vllm_process_is_served_from_the_shared_tier",
           "test_two_vllm_serve_processes_share_one_fs_directory",
           "test_tensor_parallel_restart_on_a_disk_tier_serves_each_rank_its_own_shard",
           "test_a_retrained_adapter_under_the_same_name_is_never_served_the_old_adapters_kv",
           "test_a_returning_conversation_is_routed_to_the_replica_whose_kvoffload_tier_holds_it")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.originalname or item.name
        return LONGEST.index(name) if name in LONGEST else len(LONGEST)

    items.sort(key=rank)  # stable: every other test keeps its place
