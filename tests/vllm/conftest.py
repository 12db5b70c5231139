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


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(JOB.parent)!r}); "
                    f"import vllm_job; vllm_job.make_model({str(path)!r})"], check=True)
    return str(path)
