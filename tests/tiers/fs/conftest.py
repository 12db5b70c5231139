"""A directory that a test can turn read-only under a running tier: a tmpfs remounted ``ro``
when the tests run as root (permissions do not stop root), file modes otherwise."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class SwitchableDir:
    path: Path
    mounted: bool

    def _mount(self, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True, capture_output=True)

    def read_only(self) -> None:
        if self.mounted:
            self._mount("ro")
            return
        for d in [self.path, *self.path.rglob("*")]:
            if d.is_dir():
                d.chmod(stat.S_IRUSR | stat.S_IXUSR)
            elif d.name == ".used":
                d.chmod(stat.S_IRUSR)

    def writable(self) -> None:
        if self.mounted:
            self._mount("rw")
            return
        for d in [self.path, *self.path.rglob("*")]:
            d.chmod(0o755 if d.is_dir() else 0o644)


@pytest.fixture
def switchable_dir(tmp_path) -> Iterator[SwitchableDir]:
    path = tmp_path / "cache"
    path.mkdir()
    if os.geteuid() != 0:
        yield SwitchableDir(path, mounted=False)
        SwitchableDir(path, mounted=False).writable()
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"running as root without mount rights ({done.stderr.decode().strip()[:80]}): cannot make a "
                    "directory read-only for root")
    try:
        yield SwitchableDir(path, mounted=True)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
