"""#84 item 1: the README's vLLM commands as written, on vLLM's CPU build (read from the README
as bash reads them)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_command(start: str) -> list[str]:
    """The README's shell command that starts with ``start``, as bash itself reads it: the
    block from that line on runs with its program defined as a function that prints its argv
    and exits, so quotes, line breaks inside them and continuations count as a user's shell."""
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        found = re.search(rf"^{re.escape(start)}", block, flags=re.M)
        if found:
            program = start.split()[0]
            script = f"{program}() {{ printf '%s\\0' {program} \"$@\"; exit 0; }}\n{block[found.start():]}"
            out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
            return out.split("\0")[:-1]
    raise AssertionError(f"README.md has no bash command starting with {start!r}")


def test_the_readme_says_why_the_vllm_script_fails_on_the_cpu_build(tmp_path):
    """The README's first form stops on the CPU build the way the README says it does (if a
    vLLM release fixes its script, this fails and the README's workaround paragraph goes)."""
    argv = _readme_command("vllm serve ")
    assert argv[:3] == ["vllm", "serve", "MODEL"]
    script = Path(sys.executable).parent / "vllm"
    done = subprocess.run([str(script), *[str(tmp_path) if a == "MODEL" else a for a in argv[1:]]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "PackageNotFoundError" in done.stderr, done.stderr[-2000:]
