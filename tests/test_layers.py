"""Layers import downward only: every ``kvoffload`` import (module level, inside functions and
under TYPE_CHECKING alike) goes to a layer below its own, or stays inside its own package."""

from __future__ import annotations

import ast
from pathlib import Path

import kvoffload

ROOT = Path(kvoffload.__file__).parent

#: Bottom first. Equal ranks may not import each other (only within one package).
LAYERS = [
    ("kvoffload.namespace",),
    ("kvoffload.errors", "kvoffload.kv_info", "kvoffload.logs", "kvoffload.examples",
     "kvoffload.safe_files", "kvoffload.kv_events", "kvoffload.help_format", "kvoffload.host_memory"),
    ("kvoffload.weight_digests",),
    ("kvoffload.metrics", "kvoffload.auth"),
    ("kvoffload.registry", "kvoffload"),  # the package root: its version and log set-up
    ("kvoffload.config",),
    ("kvoffload.offload",),
    ("kvoffload.transfer",),
    ("kvoffload.tiers",),
    ("kvoffload.connector",),
    ("kvoffload.engine",),
    ("kvoffload.traces", "kvoffload.workload", "kvoffload.report", "kvoffload.integrations"),
    ("kvoffload.run_command",),
    ("kvoffload.testing",),
    ("kvoffload.plan",),
    ("kvoffload.bench",),
    ("kvoffload.cache_cli",),
    ("kvoffload.cli",),
    ("kvoffload.__main__",),
]


def _unit(module: str) -> tuple[int, str]:
    """(rank, unit) of a module: the unit is the longest layer entry it falls under."""
    best: tuple[int, str] | None = None
    for rank, units in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and (best is None or len(unit) > len(best[1])):
                best = (rank, unit)
    assert best is not None, f"{module} is in no layer; add it to LAYERS"
    return best


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
    return [(line, name) for line, name in out if name == "kvoffload" or name.startswith("kvoffload.")]


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(name: str) -> str:
    """``from kvoffload.x import y`` names either a module or an attribute of kvoffload.x."""
    return name if (ROOT.parent / (name.replace(".", "/") + ".py")).exists() or (
        ROOT.parent / name.replace(".", "/")).is_dir() else name.rpartition(".")[0]


def test_every_import_goes_down():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_of(path)
        rank, unit = _unit(module)
        for line, name in _imports(path):
            target = _target(name)
            t_rank, t_unit = _unit(target)
            if t_unit == unit:
                continue
            if t_rank >= rank:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line} {module} imports {target}")
    assert upward == []


def test_bench_modules_do_not_import_each_other_in_a_cycle():
    edges = {}
    for path in (ROOT / "bench").glob("*.py"):
        edges[_module_of(path)] = {_target(n) for _, n in _imports(path) if n.startswith("kvoffload.bench.")}
    cycles = [(a, b) for a, targets in edges.items() for b in targets if a in edges.get(b, ())]
    assert cycles == []


def test_the_connector_halves_and_the_cost_model_stand_apart():
    """``connector/`` by concern: the load-cost model imports neither half (it is given what it
    weighs), the scheduler half never imports the worker half and the worker half never imports
    the scheduler half or the cost model (it decides no policy); what crosses between them is
    the plan in ``connector/`` itself (metadata, jobs)."""
    forbidden = {"cost": ("scheduler", "worker"), "scheduler": ("worker",), "worker": ("scheduler", "cost")}
    found = []
    for part, banned in forbidden.items():
        for path in sorted((ROOT / "connector" / part).rglob("*.py")):
            for line, name in _imports(path):
                if name.startswith(tuple(f"kvoffload.connector.{b}" for b in banned)):
                    found.append(f"{path.relative_to(ROOT.parent)}:{line} imports {name}")
    assert found == []


def test_nobody_reaches_into_the_cost_model():
    """The load-cost model's ``choose()`` owns every rule of how a hit loads (the step-batch
    rule included): outside ``connector/cost/`` its users call its methods, never read or
    drive its parts (``cost.overheads``, ``cost.modes``, ``cost.prefill``)."""
    import inspect

    from kvoffload.connector.cost.load_cost import LoadCostModel

    methods = {n for n, v in inspect.getmembers(LoadCostModel) if callable(v) and not n.startswith("_")}
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if (ROOT / "connector" / "cost") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "cost" and node.attr not in methods):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} reads cost.{node.attr}")
    assert found == []


def test_the_engine_knows_only_the_connector_contract():
    for path in (ROOT / "engine").rglob("*.py"):
        for line, name in _imports(path):
            assert not name.startswith(("kvoffload.offload", "kvoffload.transfer", "kvoffload.tiers")), (
                f"{path.name}:{line} imports {name}")


def test_each_tier_kind_lives_in_its_own_package():
    """A tier kind is one package, ``kvoffload.tiers.<kind>``, registered as ``<kind>.kind``:
    nothing of a built-in kind is spread over the offload, transfer or tiers layers."""
    from kvoffload.registry import TIER_KINDS

    kinds = TIER_KINDS.known()
    assert {"disk", "mooncake"} <= set(kinds)
    for kind in kinds:
        cls = TIER_KINDS.load(kind)
        assert cls.__module__ == f"kvoffload.tiers.{kind}.kind", (kind, cls.__module__)
        package = ROOT / "tiers" / kind
        for path in ROOT.rglob(f"*{kind}*.py"):
            inside = package in path.parents
            allowed = path.parent.name in ("bench", "testing")  # benchmarks and test harnesses of a kind
            assert inside or allowed, f"{path.relative_to(ROOT)}: {kind} code outside kvoffload/tiers/{kind}/"


def test_nothing_outside_testing_names_a_test_only_medium():
    import kvoffload.testing.memory_tier as memory_tier

    test_only = ("REMOTE", "RemoteLoadStoreSpec", "MemoryKind", "memory_tier")
    assert memory_tier.REMOTE == "REMOTE"
    for path in ROOT.rglob("*.py"):
        if "testing" in path.relative_to(ROOT).parts:
            continue
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name.rsplit(".", 1)[-1] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                  for a in n.names}
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        found = [t for t in test_only if t in names or t in strings]
        assert not found, f"{path.relative_to(ROOT)} names {found}"


#: The packages of the offload stack, held to classes that do their own work.
SIZED_PACKAGES = ("connector", "offload", "tiers", "transfer")


def test_no_file_over_350_lines():
    """Files past ~400 lines mix concepts (the scheduler half was 686 before its split; the
    config 540, the serving benchmark 538, the native ledger's C 751): anywhere in kvoffload,
    the native code (Python and C), the policies, the tests and the scripts alike. A file is
    split where its concepts part once it passes 350, not trimmed to stay under 400."""
    roots = (ROOT, ROOT.parent / "kvoffload_ext", ROOT.parent / "policies", ROOT.parent / "tests",
             ROOT.parent / "scripts")
    long = {str(p.relative_to(ROOT.parent)): n for root in roots for p in root.rglob("*")
            if p.suffix in (".py", ".c", ".h", ".sh") and (n := len(p.read_text().splitlines())) > 350}
    assert long == {}


def test_no_import_cycles():
    """No module reaches itself through imports (at module level or inside functions alike)."""
    modules = {_module_of(p): p for p in ROOT.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {t for _, name in _imports(p) if (t := resolve(name)) and t != m and t != "kvoffload"}
             for m, p in modules.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join([*path[path.index(t):], t]))
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


#: The one attribute a method may pass its call on to: the C ledger. The native slot table is
#: the C boundary itself (each of its methods one C call, or bound to one), not a layer over
#: another Python object.
C_BOUNDARY = {"_core"}


def _self_chain(node: ast.expr) -> list[str] | None:
    """``self.a.b`` as ``["a", "b"]``; None for anything not rooted at ``self``."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return attrs[::-1] if isinstance(node, ast.Name) and node.id == "self" and attrs else None


def _forwards(fn: ast.FunctionDef) -> bool:
    """The method's body is one call of the same-named method of an object it holds
    (``return self.x.name(...)``, ``self.x.y.name(...)``): it passes the call through."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1:
        return False
    stmt = body[0]
    call = stmt.value if isinstance(stmt, (ast.Return, ast.Expr)) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == fn.name):
        return False
    params = [a.arg for a in fn.args.args[1:]]
    passed = [a.id if isinstance(a, ast.Name) else None for a in call.args]
    passed += [k.arg if isinstance(k.value, ast.Name) and k.value.id == k.arg else None for k in call.keywords]
    held = _self_chain(call.func.value)
    # Its own arguments, unchanged (a method without any, such as ``close``, hands over an
    # owned resource's lifecycle, not a repeated interface).
    return held is not None and held[-1] not in C_BOUNDARY and bool(params) and passed == params


def test_no_pass_through_method():
    """A method does its own work: none only passes its call to the same-named method of an
    object it holds. The read path once repeated one interface three times (chain, tier, slot
    table: 17 such methods in the ledger tier alone); the chain now reads each tier's index."""
    passing = []
    for package in SIZED_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    passing += [f"{path.relative_to(ROOT.parent)}:{f.lineno} {node.name}.{f.name}"
                                for f in node.body if isinstance(f, ast.FunctionDef) and _forwards(f)]
    assert passing == []


def test_the_forwarding_check_finds_a_forwarder():
    """The check above is not vacuous: it flags the shapes the ledger tier had."""
    src = """
class T:
    def lookup(self, hashes):
        return self.index.lookup(hashes)
    def touch(self, hashes):
        self.chain.host.touch(hashes)
    def pin(self, hashes):
        return self._core.pin(hashes)
    def report(self):
        return self.index.busy()
    def close(self):
        self.pool.close()
    def pop(self, job_id):
        return self.loads.pop(job_id, None)
"""
    cls = ast.parse(src).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert [f.name for f in cls.body if isinstance(f, ast.FunctionDef) and _forwards(f)] == ["lookup", "touch"]


def test_no_constructor_tricks():
    """A class is what its ``class`` statement says: no ``__new__`` choosing another class, no
    class made at run time with ``type(name, bases, namespace)`` (the tiers once generated
    ``Native<Class>`` subclasses; the slot table is now an object the tier owns)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "__new__":
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} defines __new__")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
                    and len(node.args) == 3):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} makes a class with type()")
    assert found == []


def test_one_suffix_per_role():
    """A tier's scheduler half is a ``…Tier``, a tier-kind plugin a ``…Kind``, a chain of tiers a
    ``…TierChain`` (vLLM's own names, ``CPUOffloadingManager`` and ``FilterReusedOffloadingManager``,
    stay where vLLM users look for them)."""
    import importlib
    import pkgutil

    from kvoffload.offload.tier import Tier
    from kvoffload.tiers.base import TierKind

    for info in pkgutil.walk_packages([str(ROOT)], "kvoffload."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # the vLLM integrations, without vLLM
            continue

    def subclasses(cls: type) -> set[type]:
        out = set(cls.__subclasses__())
        return out.union(*(subclasses(c) for c in out)) if out else out

    ours = lambda c: c.__module__.startswith("kvoffload.")  # noqa: E731
    tiers = sorted(c.__name__ for c in subclasses(Tier) if ours(c))
    kinds = sorted(c.__name__ for c in subclasses(TierKind) if ours(c))
    assert {"CPUTier", "DiskTier", "FsTier", "LedgerTier", "SharedStoreTier"} <= set(tiers)
    assert {"DiskKind", "FsKind", "MooncakeKind"} <= set(kinds)
    assert [t for t in tiers if not t.endswith("Tier")] == []
    assert [k for k in kinds if not k.endswith("Kind")] == []
    # A chain is a …TierChain (the reuse filter keeps vLLM's name); no class is a "book".
    from kvoffload.offload.chain import TierChain
    chains = sorted(c.__name__ for c in subclasses(TierChain) if ours(c))
    assert {"EmptyTierChain", "HostTierChain"} <= set(chains)
    assert [c for c in chains if not c.endswith("TierChain")] == ["FilterReusedOffloadingManager"]
    books = [n for path in ROOT.rglob("*.py") for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.ClassDef) and "Book" in n.name]
    assert [b.name for b in books] == []
