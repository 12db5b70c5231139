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
