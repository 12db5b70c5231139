"""One meaning per word (docs/architecture.md, "Words"), for the words that had several: a class
named for a plan is the sizing tool's (``kvoffload/plan/``) or one of the scheduler half's
``…Planner``s; a class named for a ledger is a slot table's, in ``kvoffload/offload/``."""

from __future__ import annotations

import ast
from pathlib import Path

import kvoffload

ROOT = Path(kvoffload.__file__).parent
SOURCES = [ROOT, ROOT.parent / "kvoffload_ext", ROOT.parent / "policies"]


def classes() -> list[tuple[str, str]]:
    """(path relative to the checkout, class name) of every class in the shipped code."""
    out = []
    for root in SOURCES:
        for path in root.rglob("*.py"):
            rel = path.relative_to(ROOT.parent).as_posix()
            out += [(rel, node.name) for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ClassDef)]
    return out


def plan_misnamed(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(rel, name) for rel, name in found if "Plan" in name
            and not rel.startswith("kvoffload/plan/") and not name.endswith("Planner")]


def ledger_misnamed(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(rel, name) for rel, name in found if "Ledger" in name and not rel.startswith("kvoffload/offload/")]


def test_plan_names_the_sizing_tool_or_a_planner():
    assert plan_misnamed(classes()) == []


def test_ledger_names_a_slot_table():
    assert ledger_misnamed(classes()) == []


def test_the_rules_flag_the_names_this_project_once_had():
    once = [("kvoffload/connector/base.py", "StepPlan"), ("kvoffload_ext/copies/copy_plan.py", "CopyPlan"),
            ("kvoffload/testing/faults.py", "FaultPlan"), ("kvoffload/engine/scheduler.py", "BlockLedger")]
    assert plan_misnamed(once) == once[:3] and ledger_misnamed(once) == once[3:]
    assert plan_misnamed([("kvoffload/connector/scheduler/load_planner.py", "LoadPlanner"),
                          ("kvoffload/plan/planner.py", "PlanResult")]) == []
