"""search/ by role: imports point one way, from the vocabulary at its root up to the face (api), counting every import
(inside functions and under TYPE_CHECKING too)."""

import ast
from pathlib import Path

import blockforge

SEARCH = Path(blockforge.__file__).parent / "search"
# Lowest first: a module may import its own layer and the layers below it, never one above.
ORDER = ("vocabulary", "records", "evidence", "checks", "stages", "reports", "run", "face")
ROOT_MODULES = {"config": "vocabulary", "costs": "vocabulary", "display": "vocabulary", "preflight": "vocabulary",
                "api": "face", "__init__": "vocabulary"}


def layer_of(module: str) -> str:
    """`module` as a dotted name below blockforge.search (`records.ledger`, `config`)."""
    head = module.split(".")[0]
    return ROOT_MODULES[head] if head in ROOT_MODULES else head


def search_imports(path: Path) -> set[str]:
    """The blockforge.search modules (or packages) one file imports, anywhere in it."""
    found = set()
    package = ".".join(path.relative_to(SEARCH.parent.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            names = [name] if node.module else [f"{name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n.removeprefix("blockforge.search.") for n in names if n.startswith("blockforge.search."))
    return found


def test_no_module_of_search_imports_a_layer_above_its_own():
    offences = []
    for path in sorted(SEARCH.rglob("*.py")):
        here = ".".join(path.relative_to(SEARCH).with_suffix("").parts)
        for target in search_imports(path):
            if ORDER.index(layer_of(target)) > ORDER.index(layer_of(here)):
                offences.append(f"{here} ({layer_of(here)}) imports {target} ({layer_of(target)})")
    assert not offences, "\n".join(offences)


def test_search_keeps_a_small_root_and_its_role_folders():
    root = sorted(p.stem for p in SEARCH.glob("*.py") if p.stem != "__init__")
    folders = sorted(p.name for p in SEARCH.iterdir() if (p / "__init__.py").exists())
    assert len(root) <= 7, root
    assert set(folders) == set(ORDER) - {"vocabulary", "face"}, folders
    assert set(root) == {name for name in ROOT_MODULES if name != "__init__"}, root
