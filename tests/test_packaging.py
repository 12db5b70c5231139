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


class Installed:
    """The wheel installed into a directory of its own, run from another one with a fresh HOME
    (no ~/.cache), as a new user would after ``pip install``."""

    def __init__(self, root: Path) -> None:
        import shutil

        dist, self.site, self.home, self.work, src = (root / n for n in ("dist", "site", "home", "work", "src"))
        for d in (self.home, self.work):
            d.mkdir()
        # A copy of the tree: setuptools' build/ directory would otherwise stay in the checkout
        # and carry files removed from the source into later wheels.
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", ".ci-*", "*.egg-info", "*.so",
                                                                 "__pycache__", ".pytest_cache", ".hypothesis",
                                                                 ".mypy_cache", ".ruff_cache", "sim-out", ".venv"))
        pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)], check=True,
                       capture_output=True)
        (wheel,) = dist.glob("kvoffload-*.whl")
        subprocess.run([*pip, "install", "--no-deps", "--target", str(self.site), str(wheel)], check=True,
                       capture_output=True)
        self.env = {"HOME": str(self.home), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(self.site)}

    def run(self, *args: str, ok: bool = True) -> str:
        """Its stdout (its stderr where it is expected to fail)."""
        done = subprocess.run([sys.executable, *args], cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=600)
        assert (done.returncode == 0) == ok, f"{args}: {done.stdout[-1000:]} {done.stderr[-2000:]}"
        return done.stdout if ok else done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    return Installed(tmp_path_factory.mktemp("wheel"))


def test_the_built_wheel_runs_the_readme_commands_from_anywhere(installed):
    site, home, work, run = installed.site, installed.home, installed.work, installed.run
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


def test_the_wheel_follows_the_quickstart_literally(installed):
    """The quickstart's Python block, as written, from the installed wheel; and the commands the
    docs run beside a vLLM or Dynamo install are in the wheel."""
    import re

    page = (ROOT / "docs" / "quickstart.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", page, re.S)
    assert installed.run("-c", block).strip().endswith("{'device': 0, 'cpu': 192, 'disk': 0}")
    assert "kvoffload bench mix" in installed.run("-m", "kvoffload", "bench", "mix", "--help")
    assert "--selector" in installed.run("-m", "kvoffload.integrations.gateway_cli", "--help")
    # #71's command, on the installed wheel: the sizing answer in an operator's terms.
    sized = installed.run("-m", "kvoffload", "plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:{1,4}MiB",
                          "--slo", "ttft_p95=1s", "--price", "cpu=4/GiB")
    assert "For ttft_p95 <= 1.00 s:" in sized and "working set" in sized


def test_no_path_in_the_package_refers_outside_it():
    """Nothing under kvoffload/ reaches for the development checkout (../shared/traces only
    exists beside one): a wheel finds its files inside itself."""
    import re

    outside = re.compile(r"parents\[[2-9]\]|\.\./shared|/ \"shared\" /")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "kvoffload").rglob("*.py") if outside.search(p.read_text())]
    assert offenders == []


def test_the_trace_benchmark_runs_from_the_wheel_on_its_shipped_sample(installed):
    out = installed.run("-m", "kvoffload", "bench", "serve", "--engine", "bundled", "--workload", "trace",
                        "--configs", "plain,cpu", "--requests", "4", "--reps", "1", "--layers", "2", "--hidden", "64",
                        "--heads", "4", "--kv-heads", "2", "--vocab", "500", "--max-tokens", "2")
    assert "cpu" in out and "Traceback" not in out
    err = installed.run("-m", "kvoffload", "bench", "serve", "--engine", "bundled", "--workload", "trace", "--trace",
                        "weka", ok=False)
    line = err.strip().splitlines()[-1]
    assert "github.com/callanjfox/kv-cache-tester" in line and "--trace PATH" in line


def _small_file_system() -> list[str] | None:
    """A command prefix that runs a shell with a 1 GiB tmpfs at /mnt (a mount namespace of its
    own, so nothing here needs or changes the host's mounts); None where that is not allowed."""
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c"]
    probe = subprocess.run([*prefix, "mount -t tmpfs -o size=1G tmpfs /mnt && df -k /mnt"], capture_output=True,
                           text=True)
    return prefix if probe.returncode == 0 and "1048576" in probe.stdout else None


def test_every_packaged_example_passes_config_check_on_a_1_gib_file_system(installed):
    """The README's first vLLM config asked for 200 GiB of disk; on a machine with less free,
    ``config check`` refused it (rightly). The packaged disk examples take a share of the free
    space: every example passes on a 1 GiB file system, and says what size it chose."""
    prefix = _small_file_system()
    if prefix is None:
        pytest.skip("no unprivileged mount namespace here (unshare --user --mount)")
    from kvoffload.examples import known_examples

    script = ["mount -t tmpfs -o size=1G tmpfs /mnt", "mkdir -p /mnt/home", "export HOME=/mnt/home",
              "export KVOFFLOAD_CACHE_DIR=/mnt/cache"]
    for name in known_examples():
        script.append(f"echo '== {name}'; {sys.executable} -m kvoffload config check {name} 2>&1; echo \"rc=$?\"")
    done = subprocess.run([*prefix, " && ".join(script[:4]) + "; " + "; ".join(script[4:])], cwd=installed.work,
                          env={**installed.env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=600)
    sections = {}
    for block in (done.stdout + done.stderr).split("== ")[1:]:
        name, _, body = block.partition("\n")
        sections[name.strip()] = body
    assert sorted(sections) == known_examples()
    for name, body in sections.items():
        if name == "mooncake":  # needs a running master: refused in one line that says so
            assert "rc=2" in body and ("master" in body or "not importable" in body), body
            continue
        assert "rc=0" in body and "tiers:" in body, (name, body)
    assert "(capacity 50% of the free space there, chosen at start-up)" in sections["vllm_tiers"]
    assert "512.00 MiB" in sections["vllm_tiers"]  # half of the 1 GiB
