"""``kvoffload plan`` reads a request log in bounded memory, not only bounded lines: a line of
text as long as the line bound allows must not take dozens of times its size in RAM."""

from __future__ import annotations

import json
from pathlib import Path


def test_a_50_mb_text_line_is_one_line_within_a_memory_limit(tmp_path):
    """Round 6's last (round 7, item 13): a 50 MB text prompt (25M words) was a MemoryError
    traceback under a 1.5 GiB limit: the 64 MiB line bound allowed ~40x the line in RAM (every
    word a string, every token a Python int). Words are now hashed one at a time into 8 bytes
    each, and a prompt past MAX_TEXT_TOKENS words is refused by its line."""
    import resource
    import subprocess
    import sys

    log = tmp_path / "big.jsonl"
    log.write_text(json.dumps({"prompt": "a " * 25_000_000}) + "\n" + json.dumps({"prompt": "hello"}) + "\n")
    limit = 3 << 29  # 1.5 GiB of data (heap and anonymous maps; the libraries' code is not counted)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "kvoffload", "plan", "--log", str(log), "--model", "tiny",
                           "--tiers", "cpu:4MiB"], preexec_fn=cap, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[2])
    err = done.stderr.strip()
    assert done.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err[-500:]
    assert "line 1: the prompt's text is longer than 4,000,000 words" in err
