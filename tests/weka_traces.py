"""Hand-made traces in WEKA's kv-cache-tester format, for the reader's and the replay's tests."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path


def write_weka_tar(path: Path, conversations: list[dict]) -> None:
    """A .tar.gz of one ``traces/<id>.json`` per conversation, as the upstream archive has."""
    with tarfile.open(path, "w:gz") as tar:
        for conv in conversations:
            data = json.dumps(conv).encode()
            info = tarfile.TarInfo(f"traces/{conv['id']}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
