"""Who may import whom: the library (areal/) never imports the launcher, areal/infra, which
the launcher imports, never imports torch, transformers or sglang, the trainer engine never
imports the servers' client (it pushes weights into a sink), the rollout layer never imports an
engine, and no modules import each other (directly or through others, at the top or inside a
function)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_library_never_imports_the_launcher():
    offenders = {
        str(p.relative_to(REPO)): sorted(m for m in imported_modules(p) if m.split(".")[0] == "launcher")
        for p in (REPO / "areal").rglob("*.py")
    }
    assert {p: m for p, m in offenders.items() if m} == {}


def test_shared_helpers_stay_torch_free():
    heavy = ("torch", "transformers", "sglang", "ray")
    offenders = {
        str(p.relative_to(REPO)): sorted(m for m in imported_modules(p) if m.split(".")[0] in heavy)
        for p in (REPO / "areal" / "infra").rglob("*.py")
    }
    assert {p: m for p, m in offenders.items() if m} == {}


def _imports_under(folder: Path, forbidden: str) -> dict[str, list[str]]:
    """The modules under `folder` that import `forbidden` (a dotted prefix) anywhere in them."""
    found = {}
    for p in folder.rglob("*.py"):
        hits = sorted(
            m for m in _imports_anywhere(p, _module_name(p)) if m == forbidden or m.startswith(forbidden + ".")
        )
        if hits:
            found[str(p.relative_to(REPO))] = hits
    return found


def test_the_trainer_engine_never_imports_the_server_client():
    assert _imports_under(REPO / "areal" / "engine" / "fsdp", "areal.engine.sglang") == {}


def test_the_rollout_layer_never_imports_an_engine():
    assert _imports_under(REPO / "areal" / "rollout", "areal.engine") == {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_anywhere(path: Path, module: str) -> set[str]:
    """Every module `path` imports, at the top or inside a function (relative imports resolved;
    `from a import b` counts a and a.b, which may be a module)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_no_import_cycles():
    """No two modules of areal/ or launcher/ import each other, directly or through others. An
    import moved inside a function hides a cycle from Python but keeps it (app.py and
    openai_api.py once did that); what both sides need belongs in a third module."""
    paths = {_module_name(p): p for root in ("areal", "launcher") for p in (REPO / root).rglob("*.py")}
    graph = {m: sorted(i for i in _imports_anywhere(p, m) if i in paths and i != m) for m, p in paths.items()}
    cycles, done = [], set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            cycles.append(" -> ".join(stack[stack.index(module) :] + [module]))
            return
        if module in done:
            return
        for other in graph[module]:
            visit(other, stack + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []
