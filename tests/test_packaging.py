"""What gets installed: every package of the tree, under names that cannot collide (the
research policies install as ``kvoffload_policies``, not a top-level ``policies``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")


def test_the_package_list_covers_the_tree_and_maps_policies():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(p.parent.relative_to(ROOT).parts) for d in ("kvoffload", "kvoffload_ext")
            for p in (ROOT / d).rglob("__init__.py")}
    assert set(tool["packages"]) == tree | {"kvoffload_policies"}
    assert tool["package-dir"] == {"kvoffload_policies": "policies"}
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["kvoffload.policies"]
    assert all(target.startswith("kvoffload_policies.") for target in entry_points.values())


def test_installed_names_outside_the_checkout(tmp_path):
    code = ("import importlib.util as u; from kvoffload.registry import POLICIES; "
            "print(u.find_spec('policies') is None, POLICIES.load('s3fifo').__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "kvoffload_policies.s3fifo"]


def test_the_built_wheel_runs_the_readme_commands_from_anywhere(tmp_path):
    """The wheel, not the checkout: installed into a directory of its own and run from another
    one with a fresh HOME (no ~/.cache), as a new user would after ``pip install``."""
    import shutil

    dist, site, home, work, src = (tmp_path / n for n in ("dist", "site", "home", "work", "src"))
    for d in (home, work):
        d.mkdir()
    # A copy of the tree: setuptools' build/ directory would otherwise stay in the checkout and
    # carry files removed from the source into later wheels.
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", ".ci-*", "*.egg-info", "*.so",
                                                             "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache",
                                                             ".ruff_cache", "sim-out"))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)], check=True,
                   capture_output=True)
    (wheel,) = dist.glob("kvoffload-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}: {done.stderr[-2000:]}"
        return done.stdout

    assert str(site) in run("-c", "import kvoffload; print(kvoffload.__file__)")
    small = ["--conversations", "3", "--turns", "2"]
    first = run("-m", "kvoffload", "run", "--config", "cpu_disk")  # the README's demo: it reaches the disk
    assert "outputs identical to the run without offload: yes" in first
    second = run("-m", "kvoffload", "run", "--config", "cpu_disk")
    assert "disk blocks recovered at start" in second
    assert (home / ".cache" / "kvoffload").is_dir()
    assert "tier file(s)" in run("-m", "kvoffload", "cache", "ls")
    assert " intact" in run("-m", "kvoffload", "cache", "verify")
    assert "tiers:" in run("-m", "kvoffload", "config", "check", "cpu_disk")
    assert "outputs identical" in run("-m", "kvoffload", "run", "--config", "research_arc", *small)
    sim = run("-m", "kvoffload", "sim", "--trace", "mooncake-sample", "--policies", "lru,belady",
              "--capacities", "5%", "--workers", "1", "--out", str(work / "sim"))
    assert "unique blocks" in sim and (work / "sim" / "results.json").is_file()
    snippet = ("from kvoffload.engine import LLM, EngineConfig, SamplingParams\n"
               "with LLM(EngineConfig(model='tiny', block_size=16, num_gpu_blocks=64, kv_offload='cpu')) as llm:\n"
               "    outs = llm.generate(['a shared system prompt ...', [1, 2, 3]], SamplingParams(max_tokens=16))\n"
               "    print(len(outs[0].token_ids), sorted(llm.stats()['prefix_hit_tokens']))\n")
    assert run("-c", snippet).split() == ["16", "['cpu',", "'device',", "'disk']"]
    assert run("-c", "import importlib.resources as r; print(r.files('kvoffload') / 'py.typed')").strip()
