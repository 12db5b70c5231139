"""The tiny random Llama every real-vLLM test serves, made locally (nothing is downloaded)."""

import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("vllm_job.py")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(JOB.parent)!r}); "
                    f"import vllm_job; vllm_job.make_model({str(path)!r})"], check=True)
    return str(path)
