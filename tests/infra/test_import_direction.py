"""Who may import whom: the library (areal/) never imports the launcher, and areal/infra, which
the launcher imports, never imports torch, transformers or sglang."""

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
