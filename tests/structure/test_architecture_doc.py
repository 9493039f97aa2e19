"""docs/ARCHITECTURE.md is a map that stays true: short, its layer list the one the import test
enforces, and every module, name and path it mentions present in the tree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from int8alibi import stage_spec

from .import_graph import LAYERS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE = ROOT / "workflow" / "int8alibi"
MAX_LINES = 300
BEGIN, END = "<!-- layers: begin -->", "<!-- layers: end -->"
# `a.b.c`: a dotted name in code spans, read as a name of the package when its first part is one
DOTTED = re.compile(r"`(?:int8alibi\.)?([a-z_]+(?:\.[A-Za-z_]\w*)*)`")
# `folder/.../file`: a path in code spans, checked where it starts at a top-level folder of the tree
PATH = re.compile(r"`([\w.-]+/[\w./-]*)`")


def layers_markdown() -> str:
    """The layer list as the document shows it, lowest first."""
    lines = []
    for i, (name, entries) in enumerate(LAYERS, 1):
        shown = ", ".join("the package's `__init__`" if e == "" else f"`{e}`" for e in entries)
        lines.append(f"{i}. **{name}**: {shown}")
    return "\n".join(lines)


def _module_file(parts: list[str]) -> Path | None:
    base = PACKAGE.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def unresolved_names(text: str) -> list[str]:
    """Dotted names in code spans that start at a package module and name no module or top-level
    definition of it (a class or module's attribute one level down is accepted: `Stage.rules`)."""
    bad = []
    for name in sorted(set(DOTTED.findall(text))):
        parts = name.split(".")
        if _module_file(parts[:1]) is None or len(parts) == 1:
            continue  # not a package module (`os.environ`, a config key): not this map's claim
        i = len(parts)
        while i > 0 and _module_file(parts[:i]) is None:
            i -= 1
        rest = parts[i:]
        module = _module_file(parts[:i])
        if module is not None and (not rest or rest[0] in _top_level_names(module)):
            continue
        bad.append(name)
    return bad


def missing_paths(text: str) -> list[str]:
    """Paths in code spans that do not exist: under a top-level folder of the tree, or under a package
    folder (`faults/catalogue.py`); placeholders such as `<name>` and globs are left out."""
    tops = {p.name for p in ROOT.iterdir()}
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    bad = []
    for rel in sorted(set(PATH.findall(text))):
        first = rel.split("/")[0]
        if "<" in rel or "*" in rel or first not in tops | packages:
            continue
        if not ((ROOT if first in tops else PACKAGE) / rel.rstrip("/")).exists():
            bad.append(rel)
    return bad


def test_the_map_is_short() -> None:
    assert len(DOC.read_text().splitlines()) <= MAX_LINES


def test_its_layers_are_the_ones_the_import_test_enforces() -> None:
    text = DOC.read_text()
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    assert block == layers_markdown(), f"replace the block between the layer markers with:\n{layers_markdown()}"


def test_every_module_and_name_it_mentions_exists() -> None:
    assert unresolved_names(DOC.read_text()) == []


def test_every_path_it_mentions_exists() -> None:
    assert missing_paths(DOC.read_text()) == []


def test_every_package_and_every_stage_is_on_the_map() -> None:
    text = DOC.read_text()
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert [p for p in packages if f"`int8alibi.{p}`" not in text and f"`{p}`" not in text] == []
    assert f"`{stage_spec.__name__}`" in text


def test_a_stale_statement_is_found() -> None:
    assert unresolved_names("`int8alibi.faults.catalogue.no_such_function` and `planning.gone`") == [
        "faults.catalogue.no_such_function", "planning.gone"]
    assert missing_paths("`workflow/rules/no_such.smk`, `workflow/rules/common.smk`, `faults/gone.py`") == [
        "faults/gone.py", "workflow/rules/no_such.smk"]
    assert unresolved_names("`stage_spec.table` `os.path.join` `report/templates/`") == []
