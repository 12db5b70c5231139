"""What the selection service sees cached of a prompt on each replica: Dynamo's
``/overlap_scores``, read once for the gateway (``explain``, affinity, openings) and for the
bench's cold-router wait."""

from __future__ import annotations

from typing import Any

from kvoffload.integrations.gateway_upstream import call


def _count(value: object) -> int:
    """A block count from the selection service (anything else counts 0)."""
    return value if type(value) is int and value >= 0 else 0


def overlap_rows(selector: str, model: str, token_ids: list[int], timeout_s: float) -> list[dict[str, Any]]:
    """The selection service's ``/overlap_scores`` for a prompt: a row per replica (its id and
    its cached blocks by tier), rows without an integer ``worker_id`` left out; a failed call
    raises ``GatewayError``."""
    out = call(f"{selector}/overlap_scores", {"model_name": model, "token_ids": token_ids}, timeout_s=timeout_s,
               what="the selection service")
    rows = out.get("workers") if isinstance(out, dict) else None
    if not isinstance(rows, list):
        return []
    return [row for row in rows if isinstance(row, dict) and type(row.get("worker_id")) is int]


def cached_blocks(row: dict[str, Any]) -> tuple[int, int, int]:
    """One ``/overlap_scores`` row's cached blocks of the prompt: (device, host, disk), as the
    service reports them: cumulative (Dynamo 1.6's host count is the device's plus its
    ``host_pinned_extension_blocks``, its disk count the host's plus ``disk_extension_blocks``),
    so the largest is the replica's cached run and the extensions are not added again."""
    return _count(row.get("device_blocks")), _count(row.get("host_pinned_blocks")), _count(row.get("disk_blocks"))
